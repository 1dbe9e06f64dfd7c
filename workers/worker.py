"""The `approval-broker worker` role: an RQ worker on queue `agent-runs`, plus the resumer.

Each job runs in a forked work horse (RQ's default), so an agent that crashes or hangs takes
down only its own job; a horse that dies on its job's last attempt fails the run
(`workers.jobs.horse_killed`). The scheduler is on, so retries with back-off come back on time.
"""

from __future__ import annotations

import threading

from rq import Worker
from rq.serializers import JSONSerializer

from broker.agent_loader import AgentLoadError, load_agent
from broker.client import Broker
from broker.config import Config, Settings
from broker.errors import BrokerError
from broker.runs import RUN_QUEUE, known_agents
from workers import jobs
from workers.resumer import Resumer


def make_worker(broker: Broker, worker_class: type[Worker] = Worker) -> Worker:
    return worker_class(
        [RUN_QUEUE],
        connection=broker.redis,
        serializer=JSONSerializer,
        work_horse_killed_handler=jobs.horse_killed,
    )


def preload(broker: Broker) -> list[str]:
    """Import every registered agent once before forking, so each job starts warm.

    Returns one line per agent that can't be loaded here (its runs will fail with that error).
    """
    problems = []
    for name in sorted(known_agents(broker)):
        try:
            load_agent(broker, name)
        except (AgentLoadError, BrokerError) as exc:
            problems.append(str(exc))
    return problems


def run_worker(settings: Settings, config: Config, *, with_resumer: bool, burst: bool) -> None:
    """Work jobs until stopped (SIGINT/SIGTERM), or until the queue is empty with `burst`."""
    broker = Broker.from_settings(settings, config)
    jobs.bind(broker)
    stop = threading.Event()
    thread: threading.Thread | None = None
    if with_resumer:
        # its own connection: the work horse is forked while this thread may hold the pool
        resumer = Resumer(Broker.from_settings(settings, config))
        thread = threading.Thread(
            target=resumer.run_forever, args=(stop,), name="resumer", daemon=True
        )
        thread.start()
    for problem in preload(broker):
        print(f"warning: {problem}", flush=True)
    worker = make_worker(broker)
    print(
        f"worker ready on queue {RUN_QUEUE}" + (" (with the resumer)" if with_resumer else ""),
        flush=True,
    )
    try:
        worker.work(burst=burst, with_scheduler=True, logging_level="INFO")
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=5)
