"""What the licenses most LLMs ship under permit, with the clause that says so.

This is a summary to help people spot obligations, not legal advice: every entry cites
its clause so a human can check the text.
"""

from __future__ import annotations

from dataclasses import dataclass

YES, NO, CONDITIONAL = "yes", "no", "conditional"


@dataclass(frozen=True)
class Term:
    verdict: str  # yes | no | conditional
    summary: str
    clause: str


@dataclass(frozen=True)
class LicenseInfo:
    id: str
    name: str
    url: str
    commercial: Term
    derivatives: Term  # redistributing derivatives such as quantized or fine-tuned weights
    attribution: Term  # verdict "yes" = attribution is required
    use_restrictions: Term  # verdict "yes" = there is a use policy / restrictions
    output_training: Term  # using outputs to train or improve other models
    obligations: tuple[str, ...] = ()  # what a redistributed derivative must carry or do
    notice_text: str | None = None  # attribution text the license requires verbatim
    aliases: tuple[str, ...] = ()
    signatures: tuple[str, ...] = ()  # upper-case phrases that open the license text
    bundled_text: str | None = None  # file in llmctl/checkpoint/license_texts/


_NO_OUTPUT_LIMIT = Term(YES, "the license places no restriction on using outputs", "no clause restricts outputs")
_NO_USE_LIMIT = Term(NO, "no use restrictions beyond the law", "none")


def _rail(id_: str, name: str, url: str, section: str, signatures: tuple[str, ...]) -> LicenseInfo:
    """The BigScience / CreativeML RAIL family shares one structure."""
    dist = f"{section}4" if section else "§4"
    use = f"{section}5" if section else "§5"
    return LicenseInfo(
        id=id_, name=name, url=url,
        commercial=Term(YES, "commercial use is allowed, subject to the use restrictions",
                        f"{section}2 Grant of Copyright License" if section else "§2 Grant of Copyright License"),
        derivatives=Term(YES, "derivatives may be redistributed if the use restrictions are passed on as "
                              "enforceable terms and the license travels with them",
                         f"{dist}(a)–(d) Distribution and Redistribution"),
        attribution=Term(YES, "retain copyright, patent, trademark and attribution notices; mark modified files",
                         f"{dist}(c)–(d)"),
        use_restrictions=Term(YES, "the use-based restrictions of Attachment A apply to the model and every derivative",
                              f"{use} Use-based restrictions, Attachment A"),
        output_training=Term(CONDITIONAL, "a model distilled or trained from outputs to mimic this one is a "
                                          "'Derivative of the Model' and carries the same restrictions",
                             "§1 definition of Derivatives of the Model"),
        obligations=(
            f"include the use-based restrictions (Attachment A) as an enforceable provision in the terms you "
            f"distribute the derivative under ({dist}(a))",
            f"give every recipient a copy of the license ({dist}(b))",
            f"mark modified files with a prominent notice that you changed them ({dist}(c))",
            f"retain all copyright, patent, trademark and attribution notices ({dist}(d))",
        ),
        signatures=signatures,
    )


def _llama(id_: str, version: str, release: str, url: str, *, built_with: str | None, name_prefix: str | None,
           outputs_restricted: bool, aup: str, extra_use: str = "") -> LicenseInfo:
    if version == "2":
        notice = "Llama 2 is licensed under the LLAMA 2 Community License, Copyright (c) Meta Platforms, Inc. " \
                 "All Rights Reserved."
    else:
        brand = "Meta " if version == "3" else ""  # only Llama 3's texts say "Meta Llama"
        notice = (f"{brand}Llama {version} is licensed under the {brand}Llama {version} Community License, "
                  "Copyright © Meta Platforms, Inc. All Rights Reserved.")
    obligations = [f"provide a copy of the Llama {version} Community License Agreement with the weights (§1.b.i)"]
    if built_with:
        obligations.append(f"prominently display “{built_with}” on a related website, user interface, blog post, "
                           "about page or product documentation (§1.b.i)")
    if name_prefix:
        obligations.append(f"a distributed model created, trained or fine-tuned with the Llama Materials must "
                           f"begin its name with “{name_prefix}” (§1.b.i)")
    obligations += [f"ship a NOTICE file containing: “{notice}” (§1.b.iii)",
                    f"use must follow the Acceptable Use Policy ({aup}), incorporated by reference (§1.b.iv)"]
    if outputs_restricted:
        output = Term(NO, f"you may not use the Llama Materials or their outputs to improve any other large "
                          f"language model (excluding Llama {version} and its derivatives)", "§1.b.v")
    else:
        output = Term(CONDITIONAL, "outputs may be used to create, train or improve other AI models; a model "
                                   f"so made and distributed must begin its name with “{name_prefix}”", "§1.b.i")
    release_name = "Meta Llama 3" if version == "3" else f"Llama {version}"
    signature = ("META LLAMA 3 COMMUNITY LICENSE AGREEMENT" if version == "3"
                 else f"LLAMA {version} COMMUNITY LICENSE AGREEMENT")
    return LicenseInfo(
        id=id_, name=f"{release_name} Community License ({release})", url=url,
        commercial=Term(CONDITIONAL, "allowed unless your products had more than 700 million monthly active "
                                     f"users on the {release_name} release date; then you need a license from Meta",
                        "§2 Additional Commercial Terms"),
        derivatives=Term(YES, "derivatives (quantized, fine-tuned) may be redistributed with the obligations below",
                         "§1.a Grant of Rights, §1.b Redistribution and Use"),
        attribution=Term(YES, "the NOTICE text is required" + (f"; display “{built_with}”" if built_with else ""),
                         "§1.b.iii" + (", §1.b.i" if built_with else "")),
        use_restrictions=Term(YES, f"Acceptable Use Policy ({aup}){extra_use}", "§1.b.iv"),
        output_training=output,
        obligations=tuple(obligations),
        notice_text=notice,
        aliases=(id_, f"llama-{version}", f"llama {version}"),
        signatures=(signature,),
    )


def _qwen(id_: str, name: str, url: str, *, research: bool, legacy: bool) -> LicenseInfo:
    if research:
        commercial = Term(NO, "non-commercial (research and evaluation) use only; commercial use needs a license "
                              "from Alibaba Cloud", "§2 Grant of Rights")
    else:
        commercial = Term(CONDITIONAL, "allowed unless your product or service has more than 100 million monthly "
                                       "active users; then request a license from Alibaba Cloud", "§4 Restrictions")
    rules = "§4" if research else "§5"
    if legacy:
        output = Term(NO, "you may not use the Materials or their outputs to improve any other large language "
                          "model (excluding Tongyi Qianwen and its derivatives)", f"{rules}.b Rules of use")
    else:
        output = Term(CONDITIONAL, "a distributed model created, trained or improved with the Materials or their "
                                   "outputs must prominently display “Built with Qwen” or “Improved using Qwen”",
                      f"{rules}.b Rules of use")
    notice = f"{'Tongyi Qianwen' if legacy else 'Qwen'} is licensed under the {name}, Copyright (c) Alibaba Cloud. " \
             "All Rights Reserved."
    return LicenseInfo(
        id=id_, name=name, url=url, commercial=commercial,
        derivatives=Term(CONDITIONAL if research else YES,
                         ("derivatives may be redistributed for non-commercial use only, " if research else
                          "derivatives may be redistributed ") + "with a copy of the agreement, change notices "
                         "and the NOTICE text", "§3 Redistribution (a)–(c)"),
        attribution=Term(YES, "the NOTICE text is required", "§3.c"),
        use_restrictions=Term(YES, "comply with export controls and applicable law" +
                              ("; non-commercial only" if research else ""), f"{rules}.a Rules of use"),
        output_training=output,
        obligations=(
            "give every recipient a copy of the agreement (§3.a)",
            "mark modified files with a prominent notice that you changed them (§3.b)",
            f"ship a NOTICE file containing: “{notice}” (§3.c)",
        ),
        notice_text=notice,
        signatures=(name.upper(),),
    )


_CC_TITLES = {
    "cc-by-4.0": "ATTRIBUTION 4.0 INTERNATIONAL",
    "cc-by-sa-4.0": "ATTRIBUTION-SHAREALIKE 4.0 INTERNATIONAL",
    "cc-by-nc-4.0": "ATTRIBUTION-NONCOMMERCIAL 4.0 INTERNATIONAL",
    "cc-by-nd-4.0": "ATTRIBUTION-NODERIVATIVES 4.0 INTERNATIONAL",
}


def _creative_commons(id_: str, name: str, *, share_alike: bool = False, non_commercial: bool = False,
                      no_derivatives: bool = False) -> LicenseInfo:
    obligations = ["credit the creator, link the license and indicate that you made changes (§3(a)(1))"]
    if share_alike:
        obligations.append("license the adapted material under the same or a compatible license (§3(b))")
    return LicenseInfo(
        id=id_, name=name, url=f"https://creativecommons.org/licenses/{id_.removeprefix('cc-')}/",
        commercial=Term(NO, "non-commercial use only", "§2(a)(1) and §1(i) NonCommercial") if non_commercial
        else Term(YES, "commercial use is allowed", "§2(a)(1) License grant"),
        derivatives=Term(NO, "adapted material (e.g. quantized weights) may be made but not shared",
                         "§2(a)(1)(B) NoDerivatives") if no_derivatives else
        Term(YES, "adapted material may be shared with attribution" +
             (" under the same license" if share_alike else "") +
             (", non-commercially" if non_commercial else ""), "§2(a)(1)(B), §3"),
        attribution=Term(YES, "credit the creator, link the license, indicate changes", "§3(a)"),
        use_restrictions=Term(YES, "non-commercial only", "§2(a)(1)") if non_commercial else _NO_USE_LIMIT,
        output_training=_NO_OUTPUT_LIMIT,
        obligations=tuple(obligations),
        signatures=(_CC_TITLES[id_],),
    )


LICENSES: tuple[LicenseInfo, ...] = (
    LicenseInfo(
        id="apache-2.0", name="Apache License 2.0", url="https://www.apache.org/licenses/LICENSE-2.0",
        commercial=Term(YES, "commercial use is allowed", "§2 Grant of Copyright License"),
        derivatives=Term(YES, "derivatives may be redistributed with the license and notices", "§4 Redistribution"),
        attribution=Term(YES, "keep copyright notices and the NOTICE file, if any", "§4(c)–(d)"),
        use_restrictions=_NO_USE_LIMIT,
        output_training=_NO_OUTPUT_LIMIT,
        obligations=(
            "give every recipient a copy of the license (§4(a))",
            "mark modified files with a prominent notice that you changed them (§4(b))",
            "retain copyright, patent, trademark and attribution notices (§4(c))",
            "include the readable contents of the source's NOTICE file, if it has one (§4(d))",
        ),
        aliases=("apache-2.0", "apache 2.0", "apache2", "apache"),
        signatures=("APACHE LICENSE",),
        bundled_text="apache-2.0.txt",
    ),
    LicenseInfo(
        id="mit", name="MIT License", url="https://opensource.org/license/mit",
        commercial=Term(YES, "commercial use is allowed", "permission grant (first paragraph)"),
        derivatives=Term(YES, "derivatives may be redistributed with the copyright and permission notice",
                         "notice condition (second paragraph)"),
        attribution=Term(YES, "include the copyright notice and the permission notice", "second paragraph"),
        use_restrictions=_NO_USE_LIMIT,
        output_training=_NO_OUTPUT_LIMIT,
        obligations=("include the copyright notice and this permission notice in all copies",),
        signatures=("MIT LICENSE", "PERMISSION IS HEREBY GRANTED, FREE OF CHARGE"),
    ),
    _rail("bigscience-bloom-rail-1.0", "BigScience RAIL License v1.0",
          "https://huggingface.co/spaces/bigscience/license", "§",
          ("BIGSCIENCE RAIL LICENSE", "BIGSCIENCE RESPONSIBLE AI LICENSE")),
    _rail("bigscience-openrail-m", "BigScience Open RAIL-M License",
          "https://www.licenses.ai/blog/2022/8/26/bigscience-open-rail-m-license", "§III.",
          ("BIGSCIENCE OPEN RAIL-M",)),
    _rail("openrail", "Open RAIL (responsible AI license family)", "https://www.licenses.ai/",
          "§III.", ("OPEN RAIL",)),
    _rail("creativeml-openrail-m", "CreativeML Open RAIL-M License",
          "https://huggingface.co/spaces/CompVis/stable-diffusion-license", "§III.", ("CREATIVEML OPEN RAIL-M",)),
    _llama("llama2", "2", "July 18, 2023", "https://ai.meta.com/llama/license/", built_with=None, name_prefix=None,
           outputs_restricted=True, aup="https://ai.meta.com/llama/use-policy"),
    _llama("llama3", "3", "April 18, 2024", "https://llama.meta.com/llama3/license",
           built_with="Built with Meta Llama 3", name_prefix="Llama 3", outputs_restricted=True,
           aup="https://llama.meta.com/llama3/use-policy"),
    _llama("llama3.1", "3.1", "July 23, 2024", "https://llama.meta.com/llama3_1/license",
           built_with="Built with Llama", name_prefix="Llama", outputs_restricted=False,
           aup="https://llama.meta.com/llama3_1/use-policy"),
    _llama("llama3.2", "3.2", "September 25, 2024", "https://www.llama.com/llama3_2/license/",
           built_with="Built with Llama", name_prefix="Llama", outputs_restricted=False,
           aup="https://www.llama.com/llama3_2/use-policy",
           extra_use="; the policy withholds the multimodal models' rights from individuals and companies "
                     "domiciled in the EU"),
    _llama("llama3.3", "3.3", "December 6, 2024", "https://www.llama.com/llama3_3/license/",
           built_with="Built with Llama", name_prefix="Llama", outputs_restricted=False,
           aup="https://www.llama.com/llama3_3/use-policy"),
    _llama("llama4", "4", "April 5, 2025", "https://www.llama.com/llama4/license/",
           built_with="Built with Llama", name_prefix="Llama", outputs_restricted=False,
           aup="https://www.llama.com/llama4/use-policy",
           extra_use="; the policy withholds the multimodal models' rights from individuals and companies "
                     "domiciled in the EU"),
    LicenseInfo(
        id="gemma", name="Gemma Terms of Use", url="https://ai.google.dev/gemma/terms",
        commercial=Term(YES, "commercial use is allowed, subject to the Prohibited Use Policy", "§2.1 Grant"),
        derivatives=Term(YES, "Model Derivatives may be redistributed if the use restrictions travel with them "
                              "as enforceable terms", "§3.1 Distribution and Redistribution"),
        attribution=Term(YES, "ship the Notice text and mark modified files", "§3.1(c)–(d)"),
        use_restrictions=Term(YES, "Gemma Prohibited Use Policy (ai.google.dev/gemma/prohibited_use_policy)",
                              "§3.2 Use Restrictions"),
        output_training=Term(CONDITIONAL, "a model trained on outputs to perform like Gemma is a Model Derivative "
                                          "and carries the same terms", "§1.e definition of Model Derivatives"),
        obligations=(
            "include the use restrictions of §3.2 as an enforceable provision in your terms (§3.1(a))",
            "give every recipient a copy of the Gemma Terms of Use (§3.1(b))",
            "mark modified files with a prominent notice that you changed them (§3.1(c))",
            "ship a NOTICE file containing: “Gemma is provided under and subject to the Gemma Terms of Use "
            "found at ai.google.dev/gemma/terms” (§3.1(d))",
        ),
        notice_text="Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms",
        signatures=("GEMMA TERMS OF USE",),
    ),
    _qwen("tongyi-qianwen", "Tongyi Qianwen LICENSE AGREEMENT",
          "https://github.com/QwenLM/Qwen/blob/main/Tongyi%20Qianwen%20LICENSE%20AGREEMENT", research=False, legacy=True),
    _qwen("tongyi-qianwen-research", "Tongyi Qianwen RESEARCH LICENSE AGREEMENT",
          "https://github.com/QwenLM/Qwen/blob/main/Tongyi%20Qianwen%20RESEARCH%20LICENSE%20AGREEMENT",
          research=True, legacy=True),
    _qwen("qwen", "Qwen LICENSE AGREEMENT", "https://huggingface.co/Qwen/Qwen2.5-72B-Instruct/blob/main/LICENSE",
          research=False, legacy=False),
    _qwen("qwen-research", "Qwen RESEARCH LICENSE AGREEMENT",
          "https://huggingface.co/Qwen/Qwen2.5-3B-Instruct/blob/main/LICENSE", research=True, legacy=False),
    LicenseInfo(
        id="deepseek", name="DeepSeek License Agreement v1.0",
        url="https://github.com/deepseek-ai/DeepSeek-V3/blob/main/LICENSE-MODEL",
        commercial=Term(YES, "commercial use is allowed, subject to the use-based restrictions",
                        "§2 Grant of Copyright License, §3 Grant of Patent License"),
        derivatives=Term(YES, "derivatives may be redistributed if the use restrictions are passed on as "
                              "enforceable terms and the license travels with them", "§4 Distribution and Redistribution"),
        attribution=Term(YES, "retain attribution notices; mark modified files", "§4(c)–(d)"),
        use_restrictions=Term(YES, "the use-based restrictions of Attachment A apply to the model and derivatives",
                              "§5 Use-based restrictions, Attachment A"),
        output_training=Term(CONDITIONAL, "a model distilled from outputs is a 'Derivative of the Model' and carries "
                                          "the use restrictions", "§1 definition of Derivatives of the Model"),
        obligations=(
            "include the use-based restrictions (§5, Attachment A) as an enforceable provision in your terms (§4(a))",
            "give every recipient a copy of the license (§4(b))",
            "mark modified files with a prominent notice that you changed them (§4(c))",
            "retain all copyright, patent, trademark and attribution notices (§4(d))",
        ),
        aliases=("deepseek", "deepseek-license"),
        signatures=("DEEPSEEK LICENSE AGREEMENT",),
    ),
    _creative_commons("cc-by-4.0", "Creative Commons Attribution 4.0 International (CC BY 4.0)"),
    _creative_commons("cc-by-sa-4.0", "Creative Commons Attribution-ShareAlike 4.0 International (CC BY-SA 4.0)",
                      share_alike=True),
    _creative_commons("cc-by-nc-4.0", "Creative Commons Attribution-NonCommercial 4.0 International (CC BY-NC 4.0)",
                      non_commercial=True),
    _creative_commons("cc-by-nd-4.0", "Creative Commons Attribution-NoDerivatives 4.0 International (CC BY-ND 4.0)",
                      no_derivatives=True),
)

BY_ID: dict[str, LicenseInfo] = {info.id: info for info in LICENSES}


def lookup(name: str) -> LicenseInfo | None:
    """Find a license by hub id or alias, case-insensitively."""
    key = name.strip().lower()
    if key in BY_ID:
        return BY_ID[key]
    for info in LICENSES:
        if key in info.aliases:
            return info
    return None


def match_text(text: str) -> LicenseInfo | None:
    """Identify a license from the opening of its text; the most specific title wins."""
    head = " ".join(text[:600].upper().split())
    best: tuple[int, LicenseInfo] | None = None
    for info in LICENSES:
        for signature in info.signatures:
            if signature in head and (best is None or len(signature) > best[0]):
                best = (len(signature), info)
    return best[1] if best else None
