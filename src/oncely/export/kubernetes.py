"""Kubernetes: one `batch/v1` CronJob per job, each pod running `oncely run JOB` once.

The CronJob controller evaluates the schedule with robfig/cron in `timeZone`: plain 5-field
cron, no `L` or `#`. It fires at every instant whose wall time matches, so a fixed time in the
spring-forward gap is skipped and one in the fall-back fold fires twice (the second finds the
slot claimed). `concurrencyPolicy: Forbid` and a starting deadline keep a backlog from piling
up; the claim in `oncely run` makes any duplicate start a no-op.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..registry import Job
from .base import (
    DstModel,
    Export,
    command,
    cron_fields,
    cron_schedule,
    dst_warning,
    resource_name,
    standard_cron,
    to_yaml,
)

TARGET = "Kubernetes CronJob"


@dataclass(frozen=True)
class PodSpec:
    """What each CronJob's pods run, and the CronJob's failure handling."""

    image: str
    namespace: str | None = None
    app_spec: str | None = None
    starting_deadline: int = 300
    backoff_limit: int = 2
    service_account: str | None = None
    env_from_secret: str | None = None


def cronjob(job: Job, pod: PodSpec) -> dict[str, Any]:
    """The CronJob manifest for one job."""
    schedule = cron_schedule(job, TARGET)
    metadata: dict[str, Any] = {
        "name": resource_name(job.name, "oncely-", "a-z0-9-", 52, lower=True),
        "labels": {"app.kubernetes.io/managed-by": "oncely"},
        "annotations": {"oncely.dev/job": job.name, "oncely.dev/schedule": job.schedule.describe()},
    }
    if pod.namespace:
        metadata["namespace"] = pod.namespace
    container: dict[str, Any] = {
        "name": "oncely",
        "image": pod.image,
        "command": command(job.name, pod.app_spec),
    }
    if pod.env_from_secret:
        container["envFrom"] = [{"secretRef": {"name": pod.env_from_secret}}]
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if pod.service_account:
        pod_spec["serviceAccountName"] = pod.service_account
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": metadata,
        "spec": {
            "schedule": standard_cron(job, cron_fields(schedule.expr), TARGET),
            "timeZone": schedule.tz,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": pod.starting_deadline,
            "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3,
            "jobTemplate": {
                "spec": {
                    "backoffLimit": pod.backoff_limit,
                    "template": {
                        "metadata": {"labels": {"app.kubernetes.io/managed-by": "oncely"}},
                        "spec": pod_spec,
                    },
                }
            },
        },
    }


def export(jobs: Sequence[Job], pod: PodSpec, fmt: str, now: datetime) -> Export:
    """Multi-document YAML, or with fmt='json' one `v1/List` document holding the CronJobs."""
    manifests = [cronjob(job, pod) for job in jobs]
    warnings = [
        w
        for job in jobs
        if (w := dst_warning(job, cron_schedule(job, TARGET), TARGET, DstModel.ELAPSED, now))
    ]
    if fmt == "json":
        data = {"apiVersion": "v1", "kind": "List", "items": manifests}
        return Export(json.dumps(data, indent=2), data, warnings)
    text = "".join(f"---\n{to_yaml(m)}\n" for m in manifests)
    return Export(text, manifests, warnings)
