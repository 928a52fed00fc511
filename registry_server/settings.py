"""Registry settings: one object, read from ENVKIT_REGISTRY_* variables or given directly.

Outside development the settings refuse insecure defaults (a SQLite file in a temporary
folder is fine for development and tests; production must name its database and storage).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

__all__ = ["Settings"]


class Settings(BaseModel):
    environment: Literal["development", "production"] = "development"
    database_url: str = "sqlite:///./envkit-registry/registry.db"
    storage_dir: Path = Path("./envkit-registry/blobs")
    max_upload_bytes: int = Field(default=512 * 1024 * 1024, ge=1024)
    max_bundle_bytes: int = Field(default=512 * 1024 * 1024, ge=1024)  # uncompressed
    max_bundle_entries: int = Field(default=100_000, ge=10)
    page_size_max: int = Field(default=100, ge=1, le=1000)
    health_reports_per_hour: int = Field(default=60, ge=1)  # per token and version; more are refused (429)
    public_url: str = ""

    @model_validator(mode="after")
    def _refuse_insecure(self) -> Settings:
        if self.environment == "production":
            if self.database_url.startswith("sqlite") and "ENVKIT_REGISTRY_DATABASE_URL" not in os.environ:
                raise ValueError("production needs an explicit database: set ENVKIT_REGISTRY_DATABASE_URL")
            if not self.public_url.startswith("https://"):
                raise ValueError("production needs ENVKIT_REGISTRY_PUBLIC_URL with https://")
        return self

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        values: dict[str, object] = {}
        for field in cls.model_fields:
            env = os.environ.get(f"ENVKIT_REGISTRY_{field.upper()}")
            if env is not None:
                values[field] = env
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
