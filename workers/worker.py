"""The `approval-broker worker` role: many agent runs at once in one process, plus the resumer.

The process loads the registered agents once, then takes jobs from the RQ queue `agent-runs`
in `concurrency` slots (`workers.slots`: RQ SimpleWorkers on threads, no fork per job) and
advances every job's run on one event loop on its main thread (`workers.shared_loop`). A run
that raises, hangs or blocks the loop fails on its own with its cause; the others go on.

Isolation from crashes is by process: run several workers (`up` runs one), and a worker that is
SIGKILLed or runs out of memory stops beating, so RQ finds its jobs abandoned and retries them
on the workers left (the runner's markers make sure no tool runs twice).

SIGINT/SIGTERM stop taking jobs and let the runs in flight finish; a second one exits at once
(the runs in flight are then retried elsewhere, as after a crash).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading

from broker.domain.config import Config
from broker.domain.errors import BrokerError
from broker.domain.settings import Settings
from broker.facade import Broker, sync_at_start
from broker.runs import agent_jobs as jobs
from broker.runs import live_wait
from broker.runs.agent_loader import AgentLoadError, load_agent
from broker.runs.agent_loop import run_coroutines_with
from broker.runs.live_wait import LiveWaits
from broker.runs.starting import RUN_QUEUE, known_agents
from workers.resumer import Resumer
from workers.shared_loop import SharedLoop
from workers.slots import Slots

GC_YOUNG = 10_000
"""Young objects before a collection (Python's default: 700). An agent round makes many
short-lived objects, nearly all freed by refcount; at 700, with the start-up's objects not
frozen, collections took 18 % of the worker's CPU in the agent bench (2.2 s of 12.1 s for
1,000 cycles, a `gc.callbacks` hook), at 10,000 after `gc.freeze()` 3 % (0.33 of 11.2 s)."""


def preload(broker: Broker) -> list[str]:
    """Import every registered agent once, so that no job pays for it.

    Returns one line per agent that can't be loaded here (its runs will fail with that error).
    """
    problems = []
    for name in sorted(known_agents(broker)):
        try:
            load_agent(broker, name)
        except (AgentLoadError, BrokerError) as exc:
            problems.append(str(exc))
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json([]))
    return problems


def run_worker(
    settings: Settings,
    config: Config,
    *,
    with_resumer: bool,
    burst: bool,
    concurrency: int | None = None,
) -> None:
    """Work jobs until stopped (SIGINT/SIGTERM), or until the queue is empty with `burst`."""
    broker = Broker.from_settings(settings, config, patient=True)
    sync_at_start(broker.requests.rules)  # the config's [[rules]], before the first round
    jobs.bind(broker)
    # RQ's line per job is too many for a terminal; `up --verbose` (log level INFO) shows them
    logging.getLogger("rq.worker").setLevel(settings.log_level)
    stop = threading.Event()
    thread: threading.Thread | None = None
    if with_resumer:
        resumer = Resumer(Broker.from_settings(settings, config, patient=True))
        thread = threading.Thread(
            target=resumer.run_forever, args=(stop,), name="resumer", daemon=True
        )
        thread.start()
    for problem in preload(broker):
        print(f"warning: {problem}", flush=True)
    gc.freeze()  # the imports and the agents live for ever: full collections skip them
    gc.set_threshold(GC_YOUNG, 10, 10)
    section = config.workers
    slots_n = concurrency or section.concurrency
    shared = SharedLoop(run_timeout_s=section.run_timeout_s, loop_block_s=section.loop_block_s)
    run_coroutines_with(shared.run)
    # live waits: the fleet's default for agents without their own, on half the slots at most
    live_wait.serve(LiveWaits(0.0 if burst else section.live_wait_s, slots_n // 2))
    try:
        asyncio.run(
            _serve(
                broker,
                shared,
                slots_n,
                burst=burst,
                with_resumer=with_resumer,
                log_level=settings.log_level,
            )
        )
    finally:
        run_coroutines_with(None)
        live_wait.serve(None)
        stop.set()
        if thread is not None:
            thread.join(timeout=5)


async def _serve(
    broker: Broker,
    shared: SharedLoop,
    concurrency: int,
    *,
    burst: bool,
    with_resumer: bool,
    log_level: str = "WARNING",
) -> None:
    """The main thread's loop: serve the slots' runs until they have all ended."""
    loop = asyncio.get_running_loop()
    shared.attach(loop)
    slots = Slots(
        RUN_QUEUE,
        broker.rq_connection,
        concurrency,
        log_level,
        abandoned_after_s=broker.config.workers.abandoned_after_s,
    )
    signals = {"n": 0}

    def on_signal() -> None:
        signals["n"] += 1
        if signals["n"] == 1:
            print(f"worker: stopping; waiting for {slots.busy} run(s) in flight", flush=True)
            slots.stop.set()
        else:
            print("worker: stopping now; the runs in flight will be retried", flush=True)
            os._exit(1)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        await asyncio.to_thread(slots.start, burst=burst)
        print(
            f"worker ready on queue {RUN_QUEUE}: {concurrency} runs at once"
            + (" (with the resumer)" if with_resumer else ""),
            flush=True,
        )
        await asyncio.to_thread(slots.join)
    finally:
        slots.stop.set()
        await asyncio.to_thread(slots.close)
        shared.close()
