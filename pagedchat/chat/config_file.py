"""The chat's defaults a person sets once: ``config.toml`` in ``$XDG_CONFIG_HOME/pagedchat``
(else ``~/.config/pagedchat``), read by ``pagedchat chat``; its own flags win over it.

    model = "qwen2.5-coder-0.5b"
    system = "You answer in French."
    temperature = 0.3
    max_tokens = 256
    repetition_penalty = 1.1
    loop_guard = true"""

from __future__ import annotations

import os
import sys
from dataclasses import fields, replace
from pathlib import Path

from pagedchat.chat.conversation import SamplingSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the tomli backport, for Python 3.10
    import tomli as tomllib

SETTINGS = tuple(f.name for f in fields(SamplingSettings))
OTHER_KEYS = {"model": str, "system": str, "context_window": int, "kv_blocks": int}


class ConfigError(ValueError):
    """The config file cannot be used; the message names the file and the key."""


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "pagedchat" / "config.toml"


def read_config(path: Path | None = None) -> dict[str, object]:
    """The file's keys, checked (an absent file is an empty config)."""
    path = path or config_path()
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read it ({error})") from None
    for key, value in data.items():
        if key in OTHER_KEYS:
            kind = OTHER_KEYS[key]
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ConfigError(f"{path}: {key} must be a {kind.__name__}, got {value!r}")
        elif key not in SETTINGS:
            known = ", ".join((*SETTINGS, *OTHER_KEYS))
            raise ConfigError(f"{path}: unknown key {key!r} (keys: {known})")
    settings_of(data, SamplingSettings(), path)  # the settings' own checks, now
    return data


def settings_of(values: dict[str, object], base: SamplingSettings,
                path: Path | None = None) -> SamplingSettings:
    """``base`` with the sampling settings among ``values`` (None: not given) applied;
    ConfigError names a value the engine would refuse."""
    given = {k: v for k, v in values.items() if k in SETTINGS and v is not None}
    where = f"{path}: " if path else ""
    if not isinstance(given.get("loop_guard", True), bool):
        raise ConfigError(f"{where}loop_guard must be true or false, got "
                          f"{given['loop_guard']!r}")
    updated = replace(base, **given)
    try:
        updated.to_params()
    except ValueError as error:
        raise ConfigError(f"{where}{error}") from None
    return updated
