"""Where a role finds the private key receipts are signed with, before it starts.

`[receipts] key_file` when the config names one (a fleet: every API and worker process reads
the same file, or the same secret mounted as a file). On the embedded Redis that `up` runs, a
key made on first use in its data directory, mode 0600, so `up` signs receipts with nothing to
set up. Otherwise receipts are off (no key: decisions carry none and nothing is checked).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from broker.domain.config import Config
from broker.domain.errors import ConfigError
from broker.domain.receipts import new_key_pem, receipts_for
from broker.domain.settings import Settings
from broker.redis.embedded import (
    default_data_dir,
    private_dir,
    redis_dir,
    running_urls,
    write_private,
)

KEY_FILE = "receipts-key.pem"


def private_key_file(path: Path) -> Path:
    """`path`, holding an Ed25519 private key (made now if missing; racing makers agree)."""
    if not path.exists():
        private_dir(path.parent)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        write_private(tmp, new_key_pem().decode())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    path.chmod(0o600)
    return path


def prepare_receipt_key(settings: Settings, config: Config) -> None:
    """Fill in `[receipts] key_file` for a role about to start, and load it now, so a bad key
    stops the role at once with the key's name rather than at the first decision."""
    section = config.receipts
    if section.key_file is None:
        here = redis_dir(settings.data_dir)
        if not settings.redis_url or settings.redis_url not in running_urls(here):
            return  # a fleet without a key: receipts off
        try:
            data = Path(settings.data_dir) if settings.data_dir else default_data_dir()
            section.key_file = private_key_file(data / KEY_FILE)
        except OSError as exc:
            raise ConfigError(f"cannot make the receipts key ({exc.strerror})") from None
    receipts_for(section.key_file, tuple(section.previous_key_files), section.ttl_s)
