"""What the client reads from the environment (``REACH_BROKER_URL``), and how settings are read.

Settings are pydantic-settings models: keyword arguments are the whole truth (``ClientSettings(
broker_url=...)`` reads nothing else), and ``from_env()`` reads the process environment, or the
mapping it is given, through one source. The fleet's ``workers.settings.Settings`` is built on the
same base.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Self

from pydantic import Field
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

__all__ = ["DEFAULT_BROKER_URL", "ClientSettings", "EnvironSettings", "broker_urls", "env_name"]

DEFAULT_BROKER_URL = "amqp://guest:guest@localhost:5672//"


class _EnvironSource(EnvSettingsSource):
    """Environment variables from ``environ`` (``os.environ`` when None), read when built.

    Values are stripped, and a blank one counts as unset, so ``REACH_X=`` means the default.
    """

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str] | None) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = os.environ if self._environ is None else self._environ
        return {
            (name if self.case_sensitive else name.lower()): value.strip()
            for name, value in environ.items()
            if value.strip()
        }


class EnvironSettings(BaseSettings):
    """Frozen settings whose environment is read only by :meth:`from_env`."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # keyword arguments only: tests and benchmarks build settings without the environment
        # leaking in; from_env() hands the environment over as keyword arguments
        return (init_settings,)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """Read the settings from ``environ`` (default: the process environment).

        Raises:
            pydantic.ValidationError: a variable has a value the field refuses.
        """
        return cls(**_EnvironSource(cls, environ)())


def env_name(settings_cls: type[BaseSettings], field: str) -> str:
    """The environment variable that sets ``field`` (its alias, else prefix + name)."""
    info: FieldInfo = settings_cls.model_fields[field]
    if isinstance(info.validation_alias, str):
        return info.validation_alias
    return f"{settings_cls.model_config.get('env_prefix', '')}{field}".upper()


def broker_urls(text: str) -> list[str]:
    """The URLs in a broker URL that names several nodes of a cluster, split by ``;`` (kombu's
    failover form: ``amqp://u:p@node1:5672/vh;amqp://u:p@node2:5672/vh``); one URL gives itself."""
    return [part.strip() for part in text.split(";") if part.strip()]


class ClientSettings(EnvironSettings):
    """What ``ReachClient`` reads from the environment when it is not given it."""

    model_config = SettingsConfigDict(env_prefix="REACH_")

    broker_url: str = Field(
        DEFAULT_BROKER_URL,
        min_length=1,
        description="AMQP URL of the RabbitMQ broker the fleet listens on (a cluster's nodes: several, split by ';')",
    )
