"""The decoder a configuration asks for, and its schema registry client.

Apart from :mod:`bridge.app` so that ``bridge check`` can build the decoder without importing the
service (the Kafka client, the HTTP server, the engine): a configuration check is a short process
whose start-up is mostly imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bridge.codec.decoding import Decoder, SchemaFilesError
from bridge.core.errors import ConfigError
from bridge.core.settings import Config

if TYPE_CHECKING:
    from bridge.codec.registry import SchemaRegistryClient


def registry_client(config: Config) -> SchemaRegistryClient:
    """The schema registry client of the ``schemas`` section, with its credentials."""
    from bridge.codec.registry import SchemaRegistryClient  # httpx: only in registry mode

    schemas = config.schemas
    assert schemas.registry_url is not None  # guaranteed by the loader in registry mode
    auth = None
    if schemas.registry_username is not None and schemas.registry_password is not None:
        auth = (schemas.registry_username, schemas.registry_password.reveal().decode("utf-8"))
    return SchemaRegistryClient(schemas.registry_url, auth=auth)


def build_decoder(config: Config) -> Decoder:
    """The decoder the configuration asks for: registry-framed or registry-less. Schema files it
    cannot read are a :class:`ConfigError` of the configuration (field ``schemas.directory``)."""
    registry = registry_client(config) if config.schemas.mode == "registry" else None
    try:
        return Decoder.from_schema_dir(
            config.schemas.directory,
            registry=registry,
            max_record_bytes=config.schemas.max_record_bytes,
        )
    except SchemaFilesError as exc:
        where = "field 'schemas.directory'"
        raise ConfigError(str(config.path), [f"{where}: {each}" for each in exc.problems]) from None
