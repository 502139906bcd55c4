"""Alembic migrations of triton-tuner's own tables (``tuner_*``); run them through ``db._migrate``."""
