"""The `approval-broker worker` role: an RQ worker on queue `agent-runs`, plus the resumer.

Each job runs in a forked work horse (RQ's default), so an agent that crashes or hangs takes
down only its own job; a horse that dies on its job's last attempt fails the run
(`workers.jobs.horse_killed`). The scheduler is on, so retries with back-off come back on time.
"""

from __future__ import annotations

import threading
import time

from redis.exceptions import RedisError
from rq import Worker
from rq.serializers import JSONSerializer

from broker.agent_loader import AgentLoadError, load_agent
from broker.client import Broker
from broker.config import Config, Settings
from broker.errors import BrokerError
from broker.rules import sync_at_start
from broker.runs import RUN_QUEUE, known_agents
from workers import jobs
from workers.resumer import Resumer

# RQ re-queues the job of a killed work horse in its maintenance pass: every minute, not ten.
MAINTENANCE_INTERVAL_S = 60


def make_worker(broker: Broker, worker_class: type[Worker] = Worker) -> Worker:
    return worker_class(
        [RUN_QUEUE],
        connection=broker.store.rq_redis,  # RQ's own Redis when the broker's is a cluster
        serializer=JSONSerializer,
        work_horse_killed_handler=jobs.horse_killed,
        maintenance_interval=MAINTENANCE_INTERVAL_S,
    )


def stop_requested(worker: Worker) -> bool:
    """Did SIGINT/SIGTERM ask this worker to stop? (RQ records the time of a warm shutdown
    request, busy or not; it has no public accessor for it.)"""
    return worker._shutdown_requested_date is not None or worker._stop_requested


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
    # what every job needs and would otherwise build again in each forked horse (~60 ms)
    import anyio._backends._asyncio  # noqa: F401
    from pydantic_ai.messages import ModelMessagesTypeAdapter

    ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json([]))
    return problems


def run_worker(settings: Settings, config: Config, *, with_resumer: bool, burst: bool) -> None:
    """Work jobs until stopped (SIGINT/SIGTERM), or until the queue is empty with `burst`."""
    broker = Broker.from_settings(settings, config, patient=True)
    sync_at_start(broker.requests.rules)  # the config's [[rules]], before the first round
    jobs.bind(broker)
    stop = threading.Event()
    thread: threading.Thread | None = None
    if with_resumer:
        # its own connection: the work horse is forked while this thread may hold the pool
        resumer = Resumer(Broker.from_settings(settings, config, patient=True))
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
        while True:
            try:
                worker.work(burst=burst, with_scheduler=True, logging_level="INFO")
                problem = "stopped on an error"
            except RedisError as exc:
                problem = f"Redis failed ({exc})"
            # RQ's loop also ends, without raising, on an error it can't handle (Redis gone
            # longer than the client's retries): start a fresh worker unless told to stop
            if burst or stop_requested(worker):
                break
            print(f"worker: {problem}; starting again in 2 s", flush=True)
            time.sleep(2)
            worker = make_worker(broker)
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=5)
