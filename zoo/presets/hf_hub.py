"""``hf://org/name``: a Hugging Face Hub repository as a local folder, downloaded once.

``huggingface-hub`` (the ``[hf]`` extra) downloads the files a zoo model reads
(``*.json``, ``*.safetensors``, the tokenizer) into its own cache
(``HF_HOME``, ``~/.cache/huggingface``), so a second call is local. Gated models (Llama)
need ``huggingface-cli login`` or ``HF_TOKEN``. With no network the cached copy is used;
with no copy either, the error says how to put the files in place by hand.
"""

PREFIX = "hf://"
PATTERNS = [
    "*.json",
    "*.safetensors",
    "tokenizer.model",
    "*.jinja",
]  # config, weights (index too), tokenizer files, chat templates


def is_hub_name(name):
    return isinstance(name, str) and name.startswith(PREFIX)


def local_directory(name):
    """The local folder of ``hf://org/name[@revision]``, downloading what is missing."""
    repo_id, _, revision = name[len(PREFIX) :].partition("@")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"{name!r} is not hf://org/name (e.g. hf://meta-llama/Llama-3.2-1B)")
    try:
        import huggingface_hub
    except ImportError:
        raise ImportError(f"loading {name!r} needs huggingface-hub: pip install 'keras-zoo[hf]'") from None
    options = dict(repo_id=repo_id, revision=revision or None, allow_patterns=PATTERNS)
    try:
        return huggingface_hub.snapshot_download(**options)
    except Exception as error:  # offline, gated, or unknown: the cache may still hold it
        try:
            return huggingface_hub.snapshot_download(**options, local_files_only=True)
        except Exception:
            raise OSError(
                f"cannot download {repo_id!r} ({type(error).__name__}: {str(error).splitlines()[0][:200]}); on a machine "
                f"with access run `huggingface-cli download {repo_id} --local-dir DIR`, copy DIR here and pass its path"
            ) from None
