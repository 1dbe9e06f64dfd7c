"""The resumer's batch as one Lua step (`scripts/resume.lua`) on a single Redis.

Per batch of outbox entries the step checks each run, claims its round (`broker.live_wait`),
writes the resume job RQ's `enqueue_many` would write unless it exists or a live job owns the
round, and acknowledges the entries: one round trip, atomic, so nothing can create a job
between the check and the write (no WATCH, no retry).

The job hash is RQ's own: `JobTemplate` records, once, the commands `enqueue_many` sends for a
sample job (a recording pipeline, so RQ's code decides every field) and keeps what is the same
for every resume job; per job only the data (RQ's zlib'd JSON of the call), the description
and the timestamps change, and the template checks that it rebuilds the sample's exactly. If
RQ ever writes something else, the template refuses and the resumer keeps RQ's own path.

On a Redis Cluster RQ has a Redis of its own (`broker.store.rq_redis`), so the step can't span
both; the resumer keeps its WATCH path there.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any

from rq import Queue
from rq.serializers import JSONSerializer
from rq.utils import get_call_string, now, utcformat

from broker.jobs import resume_agent
from broker.live_wait import RESUMER, claim_field
from broker.runs import _job_options, resume_job_id

Round = tuple[str, int]  # (run id, round number)
VARYING = ("created_at", "enqueued_at", "data", "description")
"""The job fields the step writes per job; every other field is the template's."""
FUNC_NAME = f"{resume_agent.__module__}.{resume_agent.__qualname__}"
SAMPLE: Round = ("run_template", 7)
OTHER_SAMPLE: Round = ("run_template_other", 12)


class UnexpectedRQ(RuntimeError):
    """RQ's `enqueue_many` wrote something the template does not rebuild."""


class _Recorder:
    """A stand-in pipeline that keeps the commands RQ queues on it (nothing is sent)."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any, **kwargs: Any) -> _Recorder:
            self.commands.append((name, args, kwargs))
            return self

        return record


def job_data(round_: Round) -> bytes:
    """RQ's `data` field of the resume job: its JSON serializer's call tuple, zlib'd."""
    return zlib.compress(JSONSerializer.dumps((FUNC_NAME, None, round_, {})))


def job_description(round_: Round) -> str:
    return get_call_string(FUNC_NAME, round_, {}, max_length=75) or ""


def _text(value: Any) -> str | bytes:
    if isinstance(value, bytes | str):
        return value  # str enums (RQ's JobStatus) stay str: redis-py sends their value
    return str(value)


@dataclass(frozen=True)
class JobTemplate:
    """The fields every resume job shares, as RQ's `enqueue_many` writes them."""

    queue_key: str
    queues_key: str
    constant: tuple[tuple[str, Any], ...]

    @classmethod
    def from_rq(cls, queue: Queue, enqueue: Any) -> JobTemplate:
        """Record `enqueue(queue, [round], pipeline)` (RQ's path) for two different rounds and
        keep what they share: a field that differs between the two but is not one the step
        fills in per job (a job-dependent option, say) is refused, never copied to every job."""
        first = cls._recorded(queue, enqueue, SAMPLE)
        second = cls._recorded(queue, enqueue, OTHER_SAMPLE)
        if first != second:
            raise UnexpectedRQ(f"enqueue_many's fields depend on the job: {first!r} vs {second!r}")
        return cls(queue.key, queue.redis_queues_keys, first)

    @staticmethod
    def _recorded(queue: Queue, enqueue: Any, round_: Round) -> tuple[tuple[str, Any], ...]:
        """The fields RQ writes for `round_`'s job, less those the step fills in per job."""
        recorder = _Recorder()
        enqueue(queue, [round_], recorder)
        job_id = resume_job_id(*round_)
        job_key = queue.job_class.key_for(job_id)
        names = [name for name, _, _ in recorder.commands]
        if names != ["sadd", "hset", "hset", "rpush"]:
            raise UnexpectedRQ(f"enqueue_many sent {names}")
        (_, sadd, _), (_, status, _), (_, key, mapping), (_, push, _) = recorder.commands
        fields = dict(mapping["mapping"])
        expected = {"data": job_data(round_), "description": job_description(round_)}
        if (
            sadd != (queue.redis_queues_keys, queue.key)
            or status != (job_key, "status", fields.get("status"))
            or key != (job_key,)
            or push != (queue.key, job_id)
            or any(fields.get(k) != v for k, v in expected.items())
            or not set(VARYING) <= set(fields)
        ):
            raise UnexpectedRQ(f"enqueue_many wrote {recorder.commands!r}")
        return tuple((k, _text(v)) for k, v in fields.items() if k not in VARYING)


@dataclass
class ResumeBatch:
    """The jobs of one step, gathered by `enqueue_resumes` (as `broker.outbox` calls it, so
    tests can stop a resumer there) before the step runs."""

    jobs: dict[Round, tuple[bytes, str]] = field(default_factory=dict)

    def add(self, rounds: list[Round]) -> None:
        for round_ in rounds:
            self.jobs[round_] = (job_data(round_), job_description(round_))


class ResumeStep:
    """`scripts/resume.lua` on one Redis client, called by SHA (loaded again if missing)."""

    def __init__(self, redis: Any, template: JobTemplate, job_key: Any) -> None:
        source = (files("broker.scripts") / "resume.lua").read_text()
        self._script = redis.register_script(source)
        self._template = template
        self._job_key = job_key
        head: list[Any] = [len(template.constant)]
        for name, value in template.constant:
            head += [name, value]
        self._head = head

    def run(
        self,
        stream: str,
        group: str,
        entries: list[tuple[str, Round]],
        run_keys: list[str],
        batch: ResumeBatch,
    ) -> list[str]:
        """Run the step over `entries` ((entry id, round)); each entry's outcome word."""
        t = self._template
        keys: list[str] = [stream, t.queues_key, t.queue_key]
        argv: list[Any] = [group, RESUMER, utcformat(now()), *self._head]
        for (entry_id, round_), run_key in zip(entries, run_keys, strict=True):
            job_id = resume_job_id(*round_)
            data, description = batch.jobs[round_]
            keys += [run_key, self._job_key(job_id)]
            argv += [entry_id, claim_field(round_[1]), job_id, data, description]
        reply = self._script(keys=keys, args=argv)
        return [w.decode() if isinstance(w, bytes) else w for w in reply]


def enqueue_resumes(queue: Queue, rounds: list[Round], pipeline: Any) -> None:
    """Queue the resume jobs of `rounds` on `pipeline` (RQ's enqueue_many; it checks nothing).

    The caller makes sure none of them exists yet (see `broker.resume_watched`). Given the Lua
    step's `ResumeBatch`, it builds the jobs' data for the step to write (`broker.resume_step`).
    """
    if isinstance(pipeline, ResumeBatch):
        pipeline.add(rounds)
    else:
        enqueue_with_rq(queue, rounds, pipeline)


def enqueue_with_rq(queue: Queue, rounds: list[Round], pipeline: Any) -> None:
    if rounds:
        datas = [
            Queue.prepare_data(
                resume_agent,
                args=(run_id, round_no),
                **_rq_options(resume_job_id(run_id, round_no)),
            )
            for run_id, round_no in rounds
        ]
        queue.enqueue_many(datas, pipeline=pipeline)


def _rq_options(job_id: str) -> dict[str, Any]:
    """`broker.runs`'s job options, spelled as `Queue.prepare_data` takes them."""
    options = _job_options(job_id)
    options["timeout"] = options.pop("job_timeout")
    return options
