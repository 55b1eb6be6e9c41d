"""What runs: the supervisor, the scheduled-job loop and the task worker with its parts, each
handed the store, the registries (jobs, tasks) and a WorkerOptions, never the app."""
