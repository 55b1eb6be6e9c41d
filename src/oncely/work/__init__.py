"""What runs tasks: the task worker and its parts, each handed the store, the task registry
and a WorkerOptions, never the app."""
