"""Configuration: YAML plus environment overrides, documented defaults (SPEC O4)."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from gateway.config import load_settings, reference_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_reference_doc_in_step() -> None:
    """SPEC O4: docs/configuration.md documents every key with its current default."""
    assert (ROOT / "docs" / "configuration.md").read_text() == reference_markdown(), (
        "regenerate docs/configuration.md from gateway.config.reference_markdown()"
    )


def test_yaml_then_env_then_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC O4: environment beats the file, arguments beat both; untouched keys keep defaults."""
    config = tmp_path / "toolbus.yaml"
    config.write_text("server: {port: 9001, host: 0.0.0.0}\nlimits: {invoke_rate: 5}\n")
    monkeypatch.setenv("TOOLBUS_LIMITS__INVOKE_RATE", "7")
    settings = load_settings(config)
    assert (settings.server.port, settings.server.host) == (9001, "0.0.0.0")
    assert settings.limits.invoke_rate == 7.0
    assert settings.limits.invoke_burst == 100
    assert load_settings(config, server={"port": 1}).server.port == 1


def test_unknown_key_refused(tmp_path: Path) -> None:
    """SPEC O4: a misspelt key is an error naming it, not silently ignored."""
    config = tmp_path / "toolbus.yaml"
    config.write_text("server: {prot: 9001}\n")
    with pytest.raises(pydantic.ValidationError, match="prot"):
        load_settings(config)


def test_unknown_section_in_the_environment_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """SPEC O4: a variable naming no section is an error naming it, not silently ignored;
    a TOOLBUS_ name without a section delimiter (the tests' own) is left alone."""
    monkeypatch.setenv("TOOLBUS_TEST_SOMETHING", "1")
    assert load_settings().server.port == 8765
    monkeypatch.setenv("TOOLBUS_SEVER__PORT", "9000")
    with pytest.raises(pydantic.ValidationError) as refused:
        load_settings()
    assert [(e["loc"], e["type"]) for e in refused.value.errors()] == [
        (("sever",), "extra_forbidden")
    ]


def test_missing_file_refused(tmp_path: Path) -> None:
    """SPEC O4: a config path that does not exist is an error, not the defaults."""
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "absent.yaml")


def test_relative_paths_follow_the_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SPEC O4: paths in the file are relative to the file, not to the working directory."""
    folder = tmp_path / "deploy"
    folder.mkdir()
    config = folder / "toolbus.yaml"
    config.write_text(
        "data_dir: state\n"
        "auth: {token_file: secrets/tokens.yaml}\n"
        "catalog: {tools: [tools.yaml, /abs/more.yaml], profiles: [profiles.yaml]}\n"
    )
    monkeypatch.chdir(tmp_path)
    settings = load_settings(config)
    assert settings.data_dir == folder / "state"
    assert settings.auth.token_file == folder / "secrets" / "tokens.yaml"
    assert settings.catalog.tools == [folder / "tools.yaml", Path("/abs/more.yaml")]
    assert settings.catalog.profiles == [folder / "profiles.yaml"]
    monkeypatch.setenv("TOOLBUS_DATA_DIR", "elsewhere")
    assert load_settings(config).data_dir == Path("elsewhere")
