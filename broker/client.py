"""The `Broker` facade's old import path, kept for user code: the facade is `broker.facade`.

README and docs showed `from broker.client import Broker` before the package was laid out in
folders; code written then keeps working. Nothing inside `broker` imports this module (an
import-linter contract checks it).
"""

from broker.facade import Broker, Once, SweepResult

__all__ = ["Broker", "Once", "SweepResult"]
