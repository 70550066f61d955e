"""License detection on real hub files, the knowledge base, --require gating and --write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.cli_process import run_cli
from helpers.hubcache import FIXTURES, fixture_repos
from llmctl.checkpoint.license import check_requirements, detect_license
from llmctl.checkpoint.license_db import LICENSES, lookup, match_text
from llmctl.checkpoint.source import resolve_model

pytestmark = pytest.mark.subprocess

EXPECTED = {
    "bigscience/bloom": "bigscience-bloom-rail-1.0",  # card: license
    "Qwen/Qwen-72B": "tongyi-qianwen",  # no card license: LICENSE.md text
    "meta-llama/Llama-2-7b-hf": "llama2",  # gated card without license key: LICENSE.txt text
    "mistralai/Mixtral-8x7B-v0.1": "apache-2.0",
    "deepseek-ai/DeepSeek-R1": "mit",
    "TheBloke/Llama-2-13B-chat-GPTQ": "llama2",
    "Qwen/Qwen2.5-7B-Instruct": "apache-2.0",
}
REQUIRED_IDS = (
    "apache-2.0 mit bigscience-bloom-rail-1.0 bigscience-openrail-m openrail creativeml-openrail-m llama2 llama3 "
    "llama3.1 llama3.2 llama3.3 llama4 gemma tongyi-qianwen tongyi-qianwen-research qwen qwen-research deepseek "
    "cc-by-4.0 cc-by-sa-4.0 cc-by-nc-4.0"
).split()


@pytest.mark.parametrize("repo_id", fixture_repos())
def test_every_fixture_license_is_detected(repo_id: str) -> None:
    report = detect_license(resolve_model(repo_id))
    assert report.license is not None and report.license.id == EXPECTED[repo_id]
    assert report.evidence and not report.warnings


def test_knowledge_base_covers_required_licenses_with_clauses() -> None:
    ids = {info.id for info in LICENSES}
    assert set(REQUIRED_IDS) <= ids
    for info in LICENSES:
        for term in (info.commercial, info.derivatives, info.attribution, info.use_restrictions, info.output_training):
            assert term.verdict in ("yes", "no", "conditional") and term.summary and term.clause, info.id


@pytest.mark.parametrize("file_name, license_id", [
    ("llama2-LICENSE.txt", "llama2"), ("llama3-LICENSE.txt", "llama3"), ("llama3.1-LICENSE.txt", "llama3.1"),
    ("tongyi-qianwen-LICENSE.txt", "tongyi-qianwen"),
    ("tongyi-qianwen-research-LICENSE.txt", "tongyi-qianwen-research"),
    ("deepseek-LICENSE-MODEL.txt", "deepseek"), ("deepseek-LICENSE-CODE.txt", "mit"),
])
def test_license_texts_are_recognized(file_name: str, license_id: str) -> None:
    assert match_text((FIXTURES / "licenses" / file_name).read_text()).id == license_id


def test_required_notices_match_the_license_texts() -> None:
    """The NOTICE sentences llmctl writes are the ones the real texts demand, verbatim."""
    for license_id, file_name in (("llama2", "llama2-LICENSE.txt"), ("llama3", "llama3-LICENSE.txt"),
                                  ("llama3.1", "llama3.1-LICENSE.txt"), ("tongyi-qianwen", "tongyi-qianwen-LICENSE.txt"),
                                  ("tongyi-qianwen-research", "tongyi-qianwen-research-LICENSE.txt")):
        text = " ".join((FIXTURES / "licenses" / file_name).read_text().split())
        assert lookup(license_id).notice_text in text, license_id


def test_key_clauses() -> None:
    llama2, llama31 = lookup("llama2"), lookup("llama3.1")
    assert llama2.commercial.verdict == "conditional" and "700 million" in llama2.commercial.summary
    assert llama2.output_training.verdict == "no" and llama2.output_training.clause == "§1.b.v"
    assert "Built with Llama" in " ".join(llama31.obligations)
    assert any("begin its name with “Llama”" in o for o in llama31.obligations)
    assert "100 million" in lookup("tongyi-qianwen").commercial.summary
    assert lookup("tongyi-qianwen-research").commercial.verdict == "no"
    assert lookup("cc-by-nc-4.0").commercial.verdict == "no"
    rail = lookup("bigscience-bloom-rail-1.0")
    assert "enforceable" in rail.derivatives.summary and "Attachment A" in rail.use_restrictions.clause


def make_model(tmp_path: Path, front_matter: str, license_file: str | None = None) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "README.md").write_text(f"---\n{front_matter}\n---\n# card\n")
    if license_file:
        (folder / "LICENSE").write_text(license_file)
    return folder


def test_other_is_resolved_through_license_name(tmp_path: Path) -> None:
    folder = make_model(tmp_path, "license: other\nlicense_name: tongyi-qianwen\nlicense_link: https://x/LICENSE")
    report = detect_license(resolve_model(str(folder)))
    assert report.license.id == "tongyi-qianwen" and "license_name" in report.evidence[0]


def test_other_is_resolved_through_license_link(tmp_path: Path) -> None:
    folder = make_model(tmp_path, "license: other\nlicense_link: https://ai.google.dev/gemma/terms")
    assert detect_license(resolve_model(str(folder))).license.id == "gemma"


def test_unknown_license_asks_for_human_review(tmp_path: Path) -> None:
    folder = make_model(tmp_path, "license: other\nlicense_name: acme-custom")
    report = detect_license(resolve_model(str(folder)))
    assert report.license is None and "human" in report.warnings[0]
    assert check_requirements(report, ["commercial"])  # cannot be confirmed -> unmet


def test_card_and_file_disagreeing_is_a_warning(tmp_path: Path) -> None:
    llama2_text = (FIXTURES / "licenses" / "llama2-LICENSE.txt").read_text()
    folder = make_model(tmp_path, "license: apache-2.0", llama2_text)
    report = detect_license(resolve_model(str(folder)))
    assert any("llama2" in w for w in report.warnings)


def test_require_gates_with_exit_codes(tmp_path: Path) -> None:
    assert run_cli("license", "meta-llama/Llama-2-7b-hf", "--require", "commercial").returncode == 0
    refused = run_cli("license", "meta-llama/Llama-2-7b-hf", "--require", "output-training")
    assert refused.returncode == 1 and "§1.b.v" in refused.stdout
    folder = make_model(tmp_path, "license: cc-by-nc-4.0")
    assert run_cli("license", str(folder), "--require", "commercial").returncode == 1
    assert run_cli("license", str(folder), "--require", "derivatives").returncode == 0
    bad = run_cli("license", str(folder), "--require", "world-domination")
    assert bad.returncode == 2 and "unknown requirement" in bad.stderr and "Traceback" not in bad.stderr


def test_write_license_and_notice_for_a_derivative(tmp_path: Path) -> None:
    out = tmp_path / "quantized"
    result = run_cli("license", "meta-llama/Llama-2-7b-hf", "--write", str(out),
                     "--modification", "quantized to 4-bit GPTQ", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert sorted(Path(p).name for p in data["written"]) == ["LICENSE", "NOTICE"]
    assert (out / "LICENSE").read_text().startswith("LLAMA 2 COMMUNITY LICENSE AGREEMENT")
    notice = (out / "NOTICE").read_text()
    assert "meta-llama/Llama-2-7b-hf" in notice and "quantized to 4-bit GPTQ" in notice
    assert lookup("llama2").notice_text in notice
    assert "revision" in notice


def test_write_uses_bundled_text_when_the_repo_has_none(tmp_path: Path) -> None:
    out = tmp_path / "derived"
    assert run_cli("license", "mistralai/Mixtral-8x7B-v0.1", "--write", str(out)).returncode == 0
    assert "Apache License" in (out / "LICENSE").read_text()
    assert "apache-2.0" in (out / "NOTICE").read_text()


def test_license_table_output() -> None:
    result = run_cli("license", "bigscience/bloom")
    assert result.returncode == 0
    for text in ("BigScience RAIL License v1.0", "commercial use", "Attachment A", "enforceable"):
        assert text in result.stdout


@pytest.mark.parametrize("card, problem", [
    ("---\nlicense: [apache-2.0\n---\n# broken\n", "not valid YAML (line"),
    ("---\nlicense: mit\n# never closed\n", "never closes it"),
    ("---\n- mit\n- apache-2.0\n---\n", "a YAML list, not a mapping"),
])
def test_a_malformed_card_is_a_warning_not_silence(tmp_path: Path, card: str, problem: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "README.md").write_text(card)
    report = detect_license(resolve_model(str(folder)))
    assert any(problem in w and "fix the card" in w for w in report.warnings), report.warnings
    result = run_cli("license", str(folder), "--require", "commercial")
    assert result.returncode == 1 and problem in result.stdout + result.stderr
