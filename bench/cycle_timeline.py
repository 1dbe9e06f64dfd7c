"""Where one agent cycle's time goes: every Redis command of one decision -> run finished, timed.

Starts `approval-broker up` as `bench_agents.py` does, warms it up, then runs one-at-a-time
cycles (start a run, wait until it pauses, approve it over REST, wait until it finishes) while
a Redis MONITOR records every command with Redis's own timestamp. It prints the last cycle's
commands from the decision to the run's end, in milliseconds after the decision was sent, and
each cycle's decision -> finished time as the client saw it. A command run inside a Lua step
is not starred (it ran inside the step above it).

    uv run --group bench python bench/cycle_timeline.py [--cycles 3] [--width 110] [--broker-code DIR]

MONITOR costs Redis time for every command, so the times are a little longer than the
bench's; read the gaps between the steps, not the total.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
from bench_agents import throughput
from broker_side import IDLE_S, ROOT, BrokerSide, Up

STOP = "cycle-timeline-stop"


def monitor(redis: Any, lines: list[tuple[float, str, str]], watching: threading.Event) -> None:
    """Record (Redis time, "*" if a client sent it, command) until the STOP marker passes."""
    with redis.monitor() as commands:
        watching.set()
        for command in commands.listen():
            who = "" if command.get("client_type") == "lua" else "*"
            lines.append((command["time"], who, command["command"]))
            if STOP in command["command"]:
                return


async def measure(args: argparse.Namespace, tmp: Path) -> None:
    up = Up(tmp, code=args.broker_code)
    try:
        async with aiohttp.ClientSession(
            base_url=up.base,
            headers={"Authorization": f"Bearer {up.token}"},
            connector=aiohttp.TCPConnector(keepalive_timeout=IDLE_S),
        ) as client:
            await up.ready(client)
            assert up.redis is not None
            side = BrokerSide(up, client)
            await throughput(side, "fast", 20)  # warm up
            lines: list[tuple[float, str, str]] = []
            watching = threading.Event()
            watcher = threading.Thread(target=monitor, args=(up.redis, lines, watching))
            watcher.start()
            await asyncio.to_thread(watching.wait)
            for i in range(args.cycles):
                run_id = await side.start("fast")
                run = await side.until(run_id, {"waiting"})
                up.redis.echo(f"cycle-{i}-decision")
                began = time.perf_counter()
                assert await side.decide(run["pending"][0]) == 200
                await side.until(run_id, {"finished"})
                print(f"cycle {i}: decision -> finished {(time.perf_counter() - began) * 1000:.1f} ms")  # fmt: skip
                up.redis.echo(f"cycle-{i}-finished")
            up.redis.echo(STOP)
            await asyncio.to_thread(watcher.join)
    finally:
        up.stop()
    last = args.cycles - 1
    start = next(t for t, _, c in lines if f"cycle-{last}-decision" in c)
    print("\nthe last cycle's Redis commands, ms after the decision was sent")
    print("(* sent by a client; the others ran inside the Lua step above them)")
    for at, who, command in lines:
        if at < start:
            continue
        print(f"{(at - start) * 1000:8.2f}  {'*' if who else ' '}  {command[: args.width]}")
        if f"cycle-{last}-finished" in command:
            break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=3, help="one-at-a-time cycles")
    parser.add_argument("--width", type=int, default=110, help="characters of each command")
    parser.add_argument(
        "--broker-code", type=Path, default=ROOT, help="run `up` from this checkout (before/after)"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cycle-timeline-"))
    try:
        asyncio.run(measure(args, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
