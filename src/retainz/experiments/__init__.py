"""Experiments: manifests that expand into cases, a parallel runner that writes one JSON record per
case, and a verifier for records.  See ``docs/experiments.md``."""

from retainz.experiments.manifest import Case, ManifestError, TraceSpec, case_id, load_manifest
from retainz.experiments.runner import (
           Backend,
           RecordExistsError,
           RetainZBackend,
           RunSummary,
           run_cases,
           run_manifest,
)
from retainz.experiments.verify import verify_dir

__all__ = ["Case", "ManifestError", "TraceSpec", "case_id", "load_manifest", "Backend", "RecordExistsError",
           "RetainZBackend", "RunSummary", "run_cases", "run_manifest", "verify_dir"]
