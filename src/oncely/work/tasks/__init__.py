"""The task worker, in parts of one job each (see `worker` for how they fit together):

- `worker`: TaskWorker, which puts the parts together, and its shutdown;
- `leaser`: takes due tasks, as long as the lanes have room;
- `lanes`: runs up to `concurrency` attempts, starting leased-ahead tasks as lanes free up;
- `attempt`: one attempt, a task's body in a transaction of its own, to one outcome;
- `outcome`: the outcomes, as values (pure); `settler`: writes what they left to write;
- `upkeep`: heartbeats and the stall watch, rescue, presence, operators' cancels;
- `listener`: LISTEN kept up, notifications heard; `wakeups`: the notification turns (pure);
- `unrunnable`: the tasks this worker cannot run, handed back;
- `leases`: the leases the worker holds; `timing`: every constant of its timing.

Its one door to the store is the `WorkerConnections` the store hands it
(`store.worker_connections()`); a plain `def` task's body runs in `oncely.work.sync_task`.
"""

from .timing import ANNOUNCE_EVERY
from .worker import TaskWorker

__all__ = ["ANNOUNCE_EVERY", "TaskWorker"]
