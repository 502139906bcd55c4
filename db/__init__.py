"""Tuned configs in a database: one ``Record`` per (device, kernel, problem), kept by a ``Store``.

The tuner writes records; at runtime the kernels read them (``Store.open_readonly``); ``io`` moves
them between machines as JSON. Nothing here imports torch, triton, or the kernels.
"""

from __future__ import annotations

from . import _fleet_models  # noqa: F401  (the fleet's tables join Base.metadata)
from ._plausible import PEAKS, DevicePeak, peak_of, plausibility_problems
from ._record import ImportSummary, Record
from .io import (SCHEMA_VERSION, ImportValidationError, dump_document, export_records,
                 import_records, load_document)
from ._outage import Outage, server_unreachable
from .store import ON_CONFLICT_CHOICES, Store, StoreError, StoreUnreachable, default_url

__all__ = [
    "PEAKS",
    "DevicePeak",
    "peak_of",
    "plausibility_problems",
    "ON_CONFLICT_CHOICES",
    "Outage",
    "SCHEMA_VERSION",
    "ImportSummary",
    "ImportValidationError",
    "Record",
    "Store",
    "StoreError",
    "StoreUnreachable",
    "default_url",
    "dump_document",
    "export_records",
    "import_records",
    "load_document",
    "server_unreachable",
]
