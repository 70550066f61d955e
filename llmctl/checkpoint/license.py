"""Which license a model is under, what it permits, and LICENSE/NOTICE files for derivatives."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from llmctl.checkpoint.license_db import NO, YES, LicenseInfo, Term, lookup, match_text
from llmctl.checkpoint.source import ModelSource
from llmctl.errors import LlmctlError

LICENSE_FILE_NAMES = ("LICENSE", "LICENSE.txt", "LICENSE.md", "LICENSE-MODEL", "LICENSE_MODEL", "LICENCE",
                      "LICENSE.rst")
# --require NAME -> the term that must not be "no"
REQUIREMENTS = {
    "commercial": "commercial",
    "derivatives": "derivatives",
    "redistribution": "derivatives",
    "output-training": "output_training",
}


@dataclass
class LicenseReport:
    model: str
    revision: str | None
    license: LicenseInfo | None
    declared: str | None  # the card's `license` value (or license_name for "other")
    evidence: list[str] = field(default_factory=list)
    license_file: Path | None = None
    base_model: Any = None
    warnings: list[str] = field(default_factory=list)

    @property
    def known(self) -> bool:
        return self.license is not None


def card_front_matter(source: ModelSource) -> dict[str, Any]:
    """The YAML front matter of the model card (README.md), or {} when there is none or it is malformed."""
    return read_front_matter(source)[0]


def read_front_matter(source: ModelSource) -> tuple[dict[str, Any], str | None]:
    """The card's front matter, and why it could not be read when a card opens one but it is broken."""
    import yaml

    card = source.file("README.md")
    if card is None:
        return {}, None
    text = card.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return {}, None
    end = text.find("\n---", 3)
    if end == -1:
        return {}, "README.md opens a front matter block with --- but never closes it"
    try:
        data = yaml.safe_load(text[3:end])
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        return {}, f"README.md's front matter is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}"
    if data is not None and not isinstance(data, dict):
        return {}, f"README.md's front matter is a YAML {type(data).__name__}, not a mapping of fields"
    return data or {}, None


def detect_license(source: ModelSource) -> LicenseReport:
    """Card front matter first (license / license_name / license_link), then LICENSE files."""
    front, card_problem = read_front_matter(source)
    report = LicenseReport(model=source.name, revision=source.commit or source.revision, license=None,
                           declared=None, base_model=front.get("base_model"))
    if card_problem:
        report.warnings.append(f"{card_problem}: the license it declares was not read; fix the card")
    from_card = _license_from_card(front, report)
    license_file, from_file = _license_from_files(source)
    report.license_file = license_file
    if from_file is not None and license_file is not None:
        report.evidence.append(f"{license_file.name} opens with the {from_file.name} text")
    if from_card and from_file and from_card.id != from_file.id:
        report.warnings.append(
            f"the model card says {from_card.id} but {license_file.name if license_file else 'the license file'} "
            f"is {from_file.id}: check which one applies"
        )
    report.license = from_card or from_file
    if report.license is None:
        if report.declared:
            report.warnings.append(f"license '{report.declared}' is not in llmctl's knowledge base: "
                                   "a human must review it")
        else:
            report.warnings.append("no license found in the model card or license files: "
                                   "a human must review the terms before use")
    return report


def _license_from_card(front: dict[str, Any], report: LicenseReport) -> LicenseInfo | None:
    declared = front.get("license")
    if isinstance(declared, list):
        declared = declared[0] if declared else None
    if not declared:
        return None
    declared = str(declared)
    report.declared = declared
    if declared.lower() != "other":
        info = lookup(declared)
        if info:
            report.evidence.append(f"model card: license: {declared}")
        return info
    name, link = front.get("license_name"), front.get("license_link")
    if name:
        report.declared = f"other ({name})"
        info = lookup(str(name))
        if info:
            report.evidence.append(f"model card: license: other, license_name: {name}")
            return info
    if link:
        for info_id, marker in (("gemma", "gemma/terms"), ("llama3.1", "llama3_1"), ("llama3.2", "llama3_2"),
                                ("llama3.3", "llama3_3"), ("llama4", "llama4"), ("llama3", "llama3")):
            if marker in str(link):
                report.evidence.append(f"model card: license_link: {link}")
                return lookup(info_id)
    return None


def _license_from_files(source: ModelSource) -> tuple[Path | None, LicenseInfo | None]:
    first_found = None
    for name in LICENSE_FILE_NAMES:
        path = source.file(name)
        if path is None:
            continue
        first_found = first_found or path
        info = match_text(path.read_text(encoding="utf-8", errors="replace"))
        if info is not None:
            return path, info
    return first_found, None


def check_requirements(report: LicenseReport, requirements: list[str]) -> list[str]:
    """Unmet requirements, each as a sentence; [] when all pass (conditional terms pass)."""
    failures = []
    for requirement in requirements:
        attribute = REQUIREMENTS.get(requirement)
        if attribute is None:
            raise LlmctlError(f"unknown requirement '{requirement}': use one of {', '.join(REQUIREMENTS)}")
        if report.license is None:
            failures.append(f"{requirement}: the license is unknown, so it cannot be confirmed")
            continue
        term: Term = getattr(report.license, attribute)
        if term.verdict == NO:
            failures.append(f"{requirement}: not allowed by {report.license.name} ({term.clause}): {term.summary}")
    return failures


def write_license_files(report: LicenseReport, out_dir: Path, source: ModelSource, *,
                        modification: str | None = None) -> list[Path]:
    """Write LICENSE and NOTICE for an artifact derived from ``source`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    license_path, notice_path = out_dir / "LICENSE", out_dir / "NOTICE"
    license_path.write_text(_license_text(report), encoding="utf-8")
    notice_path.write_text(_notice_text(report, source, modification), encoding="utf-8")
    return [license_path, notice_path]


def _license_text(report: LicenseReport) -> str:
    if report.license_file is not None:
        return report.license_file.read_text(encoding="utf-8", errors="replace")
    info = report.license
    if info is not None and info.bundled_text:
        return (resources.files("llmctl.checkpoint") / "license_texts" / info.bundled_text).read_text(encoding="utf-8")
    if info is not None:
        return (f"{info.name}\n\nThis artifact is distributed under the {info.name}.\n"
                f"The full text is at {info.url} and must accompany every copy you distribute.\n")
    return ("License unknown.\n\nllmctl could not determine the license of the source model. Review its terms "
            "before distributing this artifact, and replace this file with the license text.\n")


def _notice_text(report: LicenseReport, source: ModelSource, modification: str | None) -> str:
    info = report.license
    lines = [f"This artifact is derived from {source.name}"
             + (f" (revision {report.revision})" if report.revision else "") + "."]
    if source.gguf_path is not None:
        lines.append(f"Source file: {source.gguf_path.name}.")
    lines.append(f"License: {info.name} ({info.id}), {info.url}" if info else "License: unknown (needs review)")
    lines.append("")
    if info and info.notice_text:
        lines += ["Required notice:", f"  {info.notice_text}", ""]
    lines.append(f"Modified: {modification or 'yes (the change was not described; pass --modification)'}"
                 f" — {_dt.date.today().isoformat()}.")
    if info and info.obligations:
        lines += ["", "Obligations that travel with this artifact:"]
        lines += [f"  - {text}" for text in info.obligations]
    if info and info.use_restrictions.verdict == YES:
        lines += ["", f"Use restrictions: {info.use_restrictions.summary} ({info.use_restrictions.clause})."]
    return "\n".join(lines) + "\n"
