"""The fleet test's processes: each role as a restartable OS process, and the chaos that kills them.

The roles take turns being SIGKILLed (`Fleet.chaos`), so a run of the test kills every role;
a process that exits without being killed is restarted too, and noted as a death of its own
(which fails the test).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support.proc import alive, descendants

CLI = [sys.executable, "-m", "approval_broker"]
ROLES = ("api", "notifier", "worker", "sweeper", "resumer")


@dataclass
class Member:
    """One role process of the fleet, restartable under the same name."""

    name: str
    kind: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    url: str | None = None
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        self.starts += 1
        with self.log.open("ab") as sink:
            sink.write(f"\n=== start #{self.starts} at {time.time():.3f}\n".encode())
            sink.flush()
            self.process = subprocess.Popen(
                [*CLI, *self.argv],
                env=self.env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def kill_tree(self) -> int:
        """SIGKILL the process and everything below it (an RQ work horse is its own group)."""
        assert self.process is not None
        victims = [self.pid, *descendants(self.pid)]
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(10)
        return len(victims)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM (RQ: finish the job in hand), then SIGKILL whatever is left."""
        if self.process is None:
            return
        tree = [self.pid, *descendants(self.pid)]
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        for pid in tree:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.process.wait(10)

    def cpu_s(self) -> float:
        """CPU seconds of this incarnation and its reaped children (RQ work horses)."""
        if self.process is None or self.process.poll() is not None:
            return 0.0
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return 0.0
        fields = stat[stat.rindex(")") + 2 :].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def tail(self, lines: int = 6) -> str:
        text = self.log.read_text(errors="replace").strip().splitlines()
        return "\n      ".join(text[-lines:])


@dataclass
class Events:
    """What the harness did and saw, for the report."""

    kills: Counter[str] = field(default_factory=Counter)
    killed_pids: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    self_deaths: list[str] = field(default_factory=list)
    redis_down_s: float = 0.0
    redis_restarted_at_run: int = 0
    start_errors: list[str] = field(default_factory=list)


class Fleet:
    def __init__(self, env: dict[str, str], logs: Path, api_ports: list[int]) -> None:
        self.events = Events()
        self.lock = threading.Lock()
        self.members: list[Member] = []
        self.api_urls = [f"http://127.0.0.1:{p}" for p in api_ports]
        roles: list[tuple[str, list[str]]] = [
            *(("api", ["api", "--port", str(p)]) for p in api_ports),
            *(("notifier", ["notifier"]) for _ in range(3)),
            *(("worker", ["worker", "--no-resumer"]) for _ in range(2)),
            *(("sweeper", ["sweeper"]) for _ in range(2)),
            ("resumer", ["resumer"]),
        ]
        seen: Counter[str] = Counter()
        for kind, argv in roles:
            seen[kind] += 1
            name = f"{kind}-{seen[kind]}"
            url = self.api_urls[seen[kind] - 1] if kind == "api" else None
            self.members.append(Member(name, kind, argv, env, logs / f"{name}.log", url))
        self._calm = threading.Event()
        """Set: no more kills."""
        self._done = threading.Event()
        """Set: no more supervising either (the fleet is being stopped)."""
        self._supervisor: threading.Thread | None = None
        self._chaos: threading.Thread | None = None

    def start(self, timeout: float = 60.0) -> None:
        for member in self.members:
            member.start()
        deadline = time.monotonic() + timeout
        for member in self.members:
            while not self._ready(member):
                if member.exited() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"{member.name} did not start:\n      {member.tail()}")
                time.sleep(0.1)

    def _ready(self, member: Member) -> bool:
        if member.url:
            try:
                return httpx.get(f"{member.url}/healthz").is_success
            except httpx.HTTPError:
                return False
        return len(member.log.read_bytes().strip().splitlines()) > 1  # said something

    def supervise(self) -> None:
        """Restart a process that exited without being killed by the harness, and note it."""
        while not self._done.wait(0.2):
            self.note_deaths(restart=True)

    def note_deaths(self, *, restart: bool) -> None:
        """Note each process that exited on its own (the harness kills and restarts under the
        lock, so a process found exited here was not the harness's doing)."""
        with self.lock:
            for member in self.members:
                code = member.exited()
                if code is not None:
                    self.events.self_deaths.append(
                        f"{member.name} exited with {code} at {time.strftime('%X')}:"
                        f"\n      {member.tail()}"
                    )
                    if restart:
                        member.start()
                    else:
                        member.process = None  # noted once

    def chaos(self, every_s: float, rng: random.Random) -> None:
        """SIGKILL a role process (and its work horse) every `every_s` s, and restart it.

        The roles take turns (api, notifier, worker, sweeper, resumer, api, ...), so every role
        is killed; only the timing and which process of the role are random.
        """
        if every_s <= 0:
            return
        turn = 0
        while not self._calm.wait(rng.uniform(every_s * 0.5, every_s * 1.5)):
            kind = ROLES[turn % len(ROLES)]
            turn += 1
            with self.lock:
                victim = rng.choice([m for m in self.members if m.kind == kind])
                self.events.killed_pids[victim.kind].add(victim.pid)
                victim.kill_tree()
                self.events.kills[victim.kind] += 1
                victim.start()

    def killed_every_role(self) -> bool:
        with self.lock:
            return all(self.events.kills[kind] >= 1 for kind in ROLES)

    def run_in_background(self, rng: random.Random, every_s: float) -> None:
        self._supervisor = threading.Thread(target=self.supervise, daemon=True)
        self._chaos = threading.Thread(target=self.chaos, args=(every_s, rng), daemon=True)
        self._supervisor.start()
        self._chaos.start()

    def calm(self) -> None:
        """Stop killing (the processes keep running, still supervised)."""
        self._calm.set()
        if self._chaos is not None:
            self._chaos.join(30)

    def cpu_by_kind(self) -> dict[str, float]:
        """CPU seconds per kind of role, counting only the processes running now."""
        cpu: Counter[str] = Counter()
        for member in self.members:
            cpu[member.kind] += member.cpu_s()
        return {kind: round(seconds, 1) for kind, seconds in cpu.items()}

    def stop(self) -> None:
        """Stop killing and supervising, note who died on their own meanwhile, stop them all."""
        self.calm()
        self._done.set()
        if self._supervisor is not None:
            self._supervisor.join(30)
        self.note_deaths(restart=False)
        for member in self.members:
            member.stop()
