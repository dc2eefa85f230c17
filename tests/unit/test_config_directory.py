"""A configuration directory (several ConfigMaps projected into one volume): which files are read,
how they merge, the problems that name their file, and ``bridge check -c DIR``. Real files and
real symlinks throughout, the Kubernetes layout written as kubelet writes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.cli import main
from bridge.config import loader
from bridge.config.directory import config_files, listing_digest
from bridge.config.loader import load_config
from bridge.core.errors import ConfigError
from bridge.core.settings import sha256_hex
from tests.kubelet_volume import AtomicWriter
from tests.yaml_nodes import yaml_nodes

REPO = Path(__file__).resolve().parents[2]

BASE = f"""\
kafka:
  group_id: from-base
schemas:
  directory: {REPO / "schemas"}
retry:
  attempts: 2
delivery:
  allow_private_networks: true
"""


def hooks(*ids: str, account: str = "acct_1", extra: str = "") -> str:
    """A file holding only a ``webhooks`` list with these ids."""
    lines = ["webhooks:"]
    for hook_id in ids:
        lines += [
            f"  - id: {hook_id}",
            f"    account: {account}",
            f"    url: https://{hook_id}.example/hook",
            "    events: [transaction.success]",
            f"    secret: secret-of-{hook_id}",
        ]
        if extra:
            lines.append(f"    {extra}")
    return "\n".join(lines) + "\n"


def make(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def problems_of(path: Path, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ or {})
    assert caught.value.path == str(path)
    return caught.value.problems


def test_files_merge_in_name_order_each_section_from_its_file(tmp_path: Path) -> None:
    folder = make(
        tmp_path / "conf.d",
        {
            "50-shops.yml": hooks("shop-b", "shop-a"),
            "00-base.yaml": BASE,
            "90-more.yaml": hooks("alerts"),
            "10-logging.yaml": "logging: {level: debug}\nwebhooks: []\n",
        },
    )

    config = load_config(folder, {})

    assert config.path == folder
    assert [w.id for w in config.webhooks] == ["shop-b", "shop-a", "alerts"]
    assert (config.kafka.group_id, config.retry.attempts) == ("from-base", 2)
    assert config.delivery.allow_private_networks and config.logging.level == "debug"
    names = ["00-base.yaml", "10-logging.yaml", "50-shops.yml", "90-more.yaml"]
    assert config.sources == (
        (folder, listing_digest(folder)),
        *((folder / name, sha256_hex((folder / name).read_bytes())) for name in names),
    )
    assert config == load_config(str(folder) + "/", {}), "a trailing slash changes nothing"


def test_hidden_entries_other_names_and_subdirectories_are_ignored(tmp_path: Path) -> None:
    folder = make(
        tmp_path / "conf.d",
        {
            "bridge.yaml": BASE + hooks("kept"),
            ".hidden.yaml": "this: is not read",
            "README.md": "# not read",
            "notes.yaml.bak": "not: read",
            "UPPER.YAML": "not: read",
        },
    )
    make(folder / "..2026_01_01_00_00_00.1", {"bridge.yaml": "stale: copy"})
    (folder / "..data").symlink_to("..2026_01_01_00_00_00.1")
    make(folder / "nested", {"deeper.yaml": hooks("not-read")})

    assert config_files(folder) == [folder / "bridge.yaml"]
    assert [w.id for w in load_config(folder, {}).webhooks] == ["kept"]


def test_a_kubernetes_volume_is_read_through_its_visible_symlinks(tmp_path: Path) -> None:
    volume = tmp_path / "etc-bridge"
    AtomicWriter(volume).write({"base.yaml": BASE, "webhooks-1.yaml": hooks("one", "two")})
    assert (volume / "base.yaml").is_symlink()
    assert os.readlink(volume / "base.yaml") == "..data/base.yaml"

    config = load_config(volume, {})

    assert [w.id for w in config.webhooks] == ["one", "two"]
    assert [path for path, _ in config.sources] == [
        volume,
        volume / "base.yaml",
        volume / "webhooks-1.yaml",
    ], "the visible names, never the timestamped copies"


def test_a_section_in_two_files_names_both(tmp_path: Path) -> None:
    folder = make(
        tmp_path / "conf.d",
        {
            "a.yaml": BASE + hooks("one"),
            "b.yaml": "webhooks: []\n\nretry:\n  attempts: 3\nkafka: {}\n",
        },
    )

    assert problems_of(folder) == [
        f"{folder / 'b.yaml'}:3: section 'retry': also in {folder / 'a.yaml'}:5 (a section "
        "other than 'webhooks' may be in one file of the directory only)",
        f"{folder / 'b.yaml'}:5: section 'kafka': also in {folder / 'a.yaml'}:1 (a section "
        "other than 'webhooks' may be in one file of the directory only)",
    ]


def test_a_duplicate_id_names_both_files_and_lines(tmp_path: Path) -> None:
    folder = make(
        tmp_path / "conf.d",
        {
            "a.yaml": BASE + hooks("one", "two"),
            "b.yaml": hooks("three", "two", "three"),
        },
    )
    a, b = folder / "a.yaml", folder / "b.yaml"

    assert problems_of(folder) == [
        f"{b}:7: webhook 'two': field 'id': duplicate webhook id (first defined on {a}:15)",
        f"{b}:12: webhook 'three': field 'id': duplicate webhook id (first defined on line 2)",
    ]


def test_a_directory_without_configuration_files_is_refused(tmp_path: Path) -> None:
    folder = make(tmp_path / "conf.d", {"README.md": "webhooks: []", ".x.yaml": "webhooks: []"})
    make(folder / "sub", {"bridge.yaml": "webhooks: []\n"})

    assert problems_of(folder) == [
        f"{folder}: no configuration file in the directory (files named *.yaml or *.yml "
        "directly in it; names starting with '.' are ignored)"
    ]
    empty = make(tmp_path / "empty", {})
    assert len(problems_of(empty)) == 1


def test_every_problem_names_its_file_and_line(tmp_path: Path) -> None:
    folder = make(
        tmp_path / "conf.d",
        {
            "1-base.yaml": BASE.replace("attempts: 2", "attempts: 99") + "bogus: 1\n",
            "2-hooks.yaml": hooks("one", "two").replace("https://two.", "ftp://two."),
            "3-broken.yaml": "webhooks: [\n",
            "4-list.yaml": "- just\n- a list\n",
            "5-empty.yaml": "",
            "6-tls.yaml": hooks("three", extra="tls_ca_file: /nonexistent/ca.pem"),
        },
    )
    base, hooks_file = folder / "1-base.yaml", folder / "2-hooks.yaml"

    assert problems_of(folder) == [
        f"{base}:6: field 'retry.attempts': must be between 1 and 20, got 99",
        f"{base}:9: section 'bogus': unknown key (known keys: kafka, schemas, topics, retry, "
        "delivery, metrics, logging, webhooks)",
        f"{hooks_file}:9: webhook 'two': field 'url': must be an absolute http:// or https:// URL",
        f"{folder / '3-broken.yaml'}:2: invalid YAML: while parsing a flow node: expected the "
        "node content, but found '<stream end>'",
        f"{folder / '4-list.yaml'}:1: the top level: must be a mapping of keys to values",
        f"{folder / '6-tls.yaml'}:7: webhook 'three': field 'tls_ca_file': cannot read "
        "/nonexistent/ca.pem",
    ]


def test_an_unreadable_file_is_named_and_the_others_are_still_checked(tmp_path: Path) -> None:
    folder = make(tmp_path / "conf.d", {"a.yaml": BASE + hooks("one", account="''")})
    (folder / "b.yaml").symlink_to("..data/b.yaml")  # dangling: a name kubelet has not filled

    assert problems_of(folder) == [
        f"{folder / 'a.yaml'}:11: webhook 'one': field 'account': must not be empty",
        f"{folder / 'b.yaml'}: cannot read the file: No such file or directory",
    ]


def test_webhooks_missing_from_every_file_names_the_directory(tmp_path: Path) -> None:
    folder = make(tmp_path / "conf.d", {"base.yaml": BASE, "other.yaml": "logging: {}\n"})

    assert problems_of(folder) == [
        f"{folder}: section 'webhooks': missing from every file (required in one of them; may "
        "be an empty list [])"
    ]


def test_secret_files_resolve_as_in_a_single_file_and_their_problems_name_their_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relative ``*_file`` paths resolve against the working directory, as in a single file (the
    same text means the same file wherever the configuration is kept)."""
    work = tmp_path / "work"
    make(work / "secrets", {"one": "secret-from-a-file\n"})
    monkeypatch.chdir(work)
    webhooks = hooks("one").replace("secret: secret-of-one", "secret_file: secrets/one")
    folder = make(tmp_path / "conf.d", {"a.yaml": BASE, "b.yaml": webhooks})
    single = make(tmp_path / "single", {"bridge.yaml": BASE + webhooks})

    config = load_config(folder, {})

    assert config.webhooks[0].secret.reveal() == b"secret-from-a-file"
    assert config.webhooks == load_config(single / "bridge.yaml", {}).webhooks
    assert config.sources[-1][0] == Path("secrets/one"), "watched for rotation"
    (work / "secrets" / "one").unlink()
    assert problems_of(folder) == [
        f"{folder / 'b.yaml'}:6: webhook 'one': field 'secret_file': cannot read secret file "
        "secrets/one: No such file or directory"
    ]


def test_the_listing_digest_moves_with_the_names_not_the_contents(tmp_path: Path) -> None:
    folder = make(tmp_path / "conf.d", {"a.yaml": "webhooks: []\n"})
    first = listing_digest(folder)
    (folder / "a.yaml").write_text("logging: {}\nwebhooks: []\n")
    make(folder, {"README.md": "", ".hidden.yaml": ""})
    assert listing_digest(folder) == first, "contents and other names are not the listing"
    (folder / "b.yaml").symlink_to("missing/b.yaml")
    dangling = listing_digest(folder)
    make(folder / "missing", {"b.yaml": "webhooks: []\n"})
    assert len({first, dangling, listing_digest(folder)}) == 3, "added; then it leads to a file"
    (folder / "b.yaml").unlink()
    assert listing_digest(folder) == first


def test_the_files_of_a_directory_share_the_size_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make(
        tmp_path / "conf.d",
        {"a.yaml": "webhooks: []\n" + "#" * 600 + "\n", "b.yaml": "#" * 600 + "\n"},
    )
    monkeypatch.setattr(loader, "CONFIG_FILE_LIMIT_BYTES", 1000)
    assert problems_of(folder) == [
        f"{folder / 'b.yaml'}: the configuration files of the directory add up to more than 0 MiB"
    ]
    monkeypatch.setattr(loader, "CONFIG_FILE_LIMIT_BYTES", 500)
    (problem,) = problems_of(folder)
    assert problem.startswith(f"{folder / 'a.yaml'}: the file is larger than")


def test_the_files_of_a_directory_share_the_node_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shops = hooks("shop-1", "shop-2")
    folder = make(tmp_path / "conf.d", {"base.yaml": BASE, "shops.yaml": shops})
    nodes = yaml_nodes(BASE) + yaml_nodes(shops)
    monkeypatch.setattr(loader, "MAX_NODES", nodes)
    assert [hook.id for hook in load_config(folder, {}).webhooks] == ["shop-1", "shop-2"]
    monkeypatch.setattr(loader, "MAX_NODES", nodes - 1)
    (problem,) = problems_of(folder)
    assert problem.startswith(f"{folder / 'shops.yaml'}:")  # (where the nodes ran out)
    assert f"more than {nodes - 1:,} nodes (keys, values and list items)" in problem


def test_bridge_check_offline_reads_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    volume = tmp_path / "etc-bridge"
    AtomicWriter(volume).write({"base.yaml": BASE, "shops.yaml": hooks("shop-1", "shop-2")})

    assert main(["check", "--offline", "-c", str(volume)]) == 0
    out = capsys.readouterr().out
    assert f"{volume}: valid; 2 webhook(s)" in out and "shop-2.example" in out
    assert "secret-of" not in out
    monkeypatch.setenv("BRIDGE_CONFIG", str(volume))
    assert main(["check", "--offline"]) == 0
    assert f"{volume}: valid; 2 webhook(s)" in capsys.readouterr().out

    AtomicWriter(volume).write({"base.yaml": BASE, "shops.yaml": hooks("shop-1", "shop-1")})
    assert main(["check", "--offline", "-c", str(volume)]) == 2
    err = capsys.readouterr().err
    assert f"{volume / 'shops.yaml'}:7: webhook 'shop-1': field 'id': duplicate" in err


def test_bridge_check_on_a_directory_as_its_own_process(tmp_path: Path) -> None:
    folder = make(tmp_path / "conf.d", {"base.yaml": BASE, "hooks.yaml": hooks("solo")})
    command = [sys.executable, "-m", "bridge", "check", "--offline", "-c", str(folder)]

    good = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    (folder / "more.yaml").write_text("retry: {attempts: 1}\n")
    bad = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    assert good.returncode == 0, good.stderr
    assert good.stdout.startswith(f"{folder}: valid; 1 webhook(s)")
    assert bad.returncode == 2, bad.stdout
    assert f"{folder / 'more.yaml'}:1: section 'retry': also in {folder / 'base.yaml'}:5" in (
        bad.stderr
    )
