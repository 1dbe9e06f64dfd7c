"""A fleet's roles in this process (worker, resumer), for end-to-end runs without subprocesses."""

from __future__ import annotations

from rq import SimpleWorker
from rq.serializers import JSONSerializer

from broker.domain.models import Run
from broker.facade import Broker
from broker.runs.starting import run_queue
from workers.resumer import Resumer


class Fleet:
    """An RQ SimpleWorker and a resumer, driven step by step from the test."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.resumer = Resumer(broker, consumer="test-resumer", block_ms=None)
        self.resumed: list[str] = []

    def work(self) -> None:
        queue = run_queue(self.broker)
        worker = SimpleWorker([queue], connection=self.broker.redis, serializer=JSONSerializer)
        worker.work(burst=True, logging_level="WARNING")

    def settle(self) -> None:
        """Resume what is answered and run every job, until nothing is left to do."""
        for _ in range(20):
            self.resumed += [h.action for h in self.resumer.run_once()]
            if run_queue(self.broker).count == 0:
                return
            self.work()
        raise AssertionError("the fleet never settled")

    def run(self, run_id: str) -> Run:
        self.settle()
        return self.broker.get_run(run_id)
