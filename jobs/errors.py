"""Errors a user can cause. Each message says what was wrong and what to do; the CLI prints it as one line."""

from __future__ import annotations


class FreightError(Exception):
    """Base of every error freight reports to a user as one line (exit status 2 in the CLI)."""


class InputError(FreightError):
    """The input dataset is missing, unreadable, empty, or lacks a usable prompt column."""


class ModelNotFoundError(FreightError):
    """The model folder or prefix has no Hugging Face checkpoint (config.json)."""


class SpecMismatchError(FreightError):
    """OUT already holds a job with a different spec; the message names the differing fields.
    `differences`: (field path such as "sampling.max_tokens", value there, value asked for)."""

    def __init__(self, message: str, differences: tuple[tuple[str, object, object], ...] = ()) -> None:
        super().__init__(message)
        self.differences = differences


class JobIncompleteError(FreightError):
    """finalize was asked for while shards are still uncommitted."""


class StorageError(FreightError):
    """Object storage cannot be used at all: a missing bucket, no credentials, an unreachable endpoint,
    access denied. Distinct from ObjectNotFoundError (one key is absent). Only two kinds say something
    definite about what is stored: ObjectNotFoundError and BucketNotFoundError; any other StorageError
    (StorageUnavailableError, denied access, bad credentials) says only that this process got no
    answer now, so nothing may be concluded from it about a job's output (jobs/reconcile.py)."""


class StorageUnavailableError(StorageError):
    """Storage did not answer, after the client's retries: a refused or dropped connection, a connect
    or read timeout, throttling (SlowDown, 429), a 5xx. Transient: try again later."""


class BucketNotFoundError(StorageError):
    """The store answered that the bucket does not exist (NoSuchBucket): whatever was in it is gone."""


class ManifestError(FreightError, ValueError):
    """OUT/manifest.json is there but this freight cannot read it (a ValueError too, as pydantic's and
    json's errors are, so code that catches those still catches it)."""


class NewerManifestError(ManifestError):
    """The manifest was written by a newer freight: a format version, fields or values this version does
    not know. Nothing is wrong with the job; a newer freight runs it (a fleet mid-upgrade)."""


class CorruptManifestError(ManifestError):
    """The manifest is damaged: not JSON, not an object, or missing or mistyped fields that no freight
    writes. The job cannot run from it."""


class ObjectNotFoundError(FreightError, KeyError):
    """An object store key does not exist."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else "object not found"


class AdapterRefusedError(FreightError):
    """A LoRA adapter of the job cannot be served over its model: missing files, options freight does
    not compute, another base's shapes or name, a rank over the limit; the message names the adapter."""
