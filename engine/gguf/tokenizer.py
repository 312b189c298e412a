"""The tokenizer a GGUF file carries (``tokenizer.ggml.*``), built as llama.cpp reads it.

Byte-level BPE (``tokenizer.ggml.model`` "gpt2") splits the text with the regexes llama.cpp uses
for the file's ``tokenizer.ggml.pre`` before merging; an unknown pre-tokenizer is refused by
name rather than guessed. SentencePiece vocabularies ("llama") merge by token score, escape
spaces as ``▁`` and fall back to ``<0xXX>`` byte tokens. Control tokens are special; user-defined
ones are matched in any text, as llama.cpp does. BOS, EOS, EOT and the end-of-generation set come
from the file, as does the chat template. The result is a Hugging Face fast tokenizer, so the
rest of mlxray (engine/vocab.py's Vocab, chat templates, grammars) treats it as any model
folder's.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
from tokenizers import pre_tokenizers as pre

from .reader import GGUFError, GGUFFile

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# llama-vocab.cpp's pre-tokenizer regexes (llm_tokenizer_bpe), applied one after the other
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
         rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SEED_CODER = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
BAILING = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")
PORO = r" ?[^(\s|.,!?…。，、।۔،)]+"
DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]")
STARCODER = (r"\p{N}", GPT2)
FALCON = (r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]")
DEEPSEEK_CODER = ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}")
DEEPSEEK3 = (r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
             r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?"
             r"[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _names(names: str, regexes: tuple[str, ...], ignore_merges: bool = False,
           add_bos: bool = False) -> dict[str, tuple[tuple[str, ...], bool, bool]]:
    return {name: (regexes, ignore_merges, add_bos) for name in names.split()}


# tokenizer.ggml.pre -> (regexes, ignore_merges, add_bos when the file does not say)
PRE_TOKENIZERS = {
    **_names("default", DEFAULT),
    **_names("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2", (LLAMA3,),
             ignore_merges=True, add_bos=True),
    **_names("dbrx smaug-bpe glm4 chatglm-bpe", (LLAMA3,)),
    **_names("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum mpt "
             "olmo jais trillion granite-docling exaone4", (GPT2,)),
    **_names("starcoder refact command-r smollm codeshell exaone minerva-7b", STARCODER),
    **_names("qwen2 deepseek-r1-qwen megrez stablelm2 hunyuan solar-open grok-2", (QWEN2,)),
    **_names("qwen35", (QWEN35,)),
    **_names("falcon", FALCON),
    **_names("deepseek-coder", DEEPSEEK_CODER),
    **_names("deepseek-v3", DEEPSEEK3),
    **_names("tekken", (TEKKEN,), ignore_merges=True, add_bos=True),
    **_names("gpt-4o llama4", (GPT4O,)),
    **_names("seed-coder", (SEED_CODER,)),
    **_names("bailingmoe bailingmoe2 llada-moe", (BAILING,)),
    **_names("poro-chat bloom gpt3-finnish", (PORO,)),
    **_names("viking", (PORO, r"\p{N}")),
}

# llama-vocab.cpp: tokens that end generation, found by their text
EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
             "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
             "<end_of_utterance>"}
EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|end_of_text|>", "<EOT>", "_<EOT>", "<end_of_utterance>")
FIM_EOG_TEXTS = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>",
                 "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>"}


class GGUFTokenizer:
    """The pieces of a GGUF file's tokenizer that the HF tokenizer and Vocab are made of."""

    def __init__(self, file: GGUFFile):
        self.file = file
        self.model = str(file.get("tokenizer.ggml.model", ""))
        # llama.cpp names an empty token [EMPTY_i] and refuses a vocabulary with duplicates
        self.tokens: list[str] = [text or f"[EMPTY_{i}]" for i, text in
                                  enumerate(file.get("tokenizer.ggml.tokens") or [])]
        if not self.tokens:
            raise GGUFError(f"{file.path}: no tokenizer.ggml.tokens: mlxray needs the file's "
                            "vocabulary")
        n = len(self.tokens)
        self.types: list[int] = list(file.get("tokenizer.ggml.token_type") or [NORMAL] * n)
        self.ids = {text: i for i, text in enumerate(self.tokens)}
        if len(self.ids) != n:
            twice = next(t for i, t in enumerate(self.tokens) if self.ids[t] != i)
            raise GGUFError(f"{file.path}: duplicate token in vocabulary: '{twice}'")
        spm = self.model == "llama"
        default_bos, default_eos = (1, 2) if spm else (11, 11)
        self.bos_id = self._id("bos", default_bos)
        self.eos_id = self._id("eos", default_eos)
        self.unk_id = self._id("unknown", 0 if spm else None)

    def _id(self, name: str, default: int | None) -> int | None:
        value = self.file.get(f"tokenizer.ggml.{name}_token_id", default)
        return int(value) if value is not None and 0 <= int(value) < len(self.tokens) else None

    def build(self) -> Tokenizer:
        if self.model == "gpt2":
            tok, add_bos = self._bpe()
        elif self.model == "llama":
            tok, add_bos = self._spm(), True
        else:
            raise GGUFError(f"{self.file.path}: tokenizer.ggml.model '{self.model}' is not "
                            "supported (mlxray reads 'gpt2' byte-level BPE and 'llama' "
                            "SentencePiece vocabularies)")
        added = [AddedToken(self.tokens[i], special=t != USER_DEFINED, normalized=False)
                 for i, t in enumerate(self.types) if t in (CONTROL, USER_DEFINED, UNKNOWN)]
        tok.add_tokens(added)
        self.add_bos = bool(self.file.get("tokenizer.ggml.add_bos_token", add_bos))
        if self.add_bos and self.bos_id is not None:
            bos = self.tokens[self.bos_id]
            tok.post_processor = processors.TemplateProcessing(
                single=f"{bos}:0 $A:0", special_tokens=[(bos, self.bos_id)])
        return tok

    def _bpe(self) -> tuple[Tokenizer, bool]:
        pre_name = str(self.file.get("tokenizer.ggml.pre", "default"))
        if pre_name not in PRE_TOKENIZERS:
            raise GGUFError(f"{self.file.path}: unknown pre-tokenizer '{pre_name}' "
                            "(tokenizer.ggml.pre); mlxray splits text as llama.cpp does for: "
                            f"{', '.join(sorted(PRE_TOKENIZERS))}")
        regexes, ignore_merges, add_bos = PRE_TOKENIZERS[pre_name]
        merges = [_split_merge(m) for m in self.file.get("tokenizer.ggml.merges") or []]
        tok = Tokenizer(models.BPE(self.ids, merges, ignore_merges=ignore_merges))
        tok.pre_tokenizer = pre.Sequence(
            [pre.Split(Regex(r), behavior="isolated") for r in regexes]
            + [pre.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        return tok, add_bos

    def _spm(self) -> Tokenizer:
        scores = list(self.file.get("tokenizer.ggml.scores") or [0.0] * len(self.tokens))
        unk = self.tokens[self.unk_id] if self.unk_id is not None else None
        tok = Tokenizer(models.BPE(self.ids, spm_merges(self.tokens, scores), unk_token=unk,
                                   fuse_unk=True, byte_fallback=True))
        escape = [normalizers.Replace(" ", "▁")]
        if self.file.get("tokenizer.ggml.add_space_prefix", True):
            escape.insert(0, normalizers.Prepend("▁"))
        tok.normalizer = normalizers.Sequence(escape)
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse()])
        return tok

    def eog_ids(self) -> set[int]:
        """llama.cpp's end-of-generation set: EOS, EOT and EOM (from the file, else found by
        text), the FIM pad/repo/separator tokens and every token with an end-of-turn text."""
        eog = {i for i, text in enumerate(self.tokens) if text in EOG_TEXTS | FIM_EOG_TEXTS}
        eot = self._id("eot", None)
        if eot is None:
            eot = next((self.ids[t] for t in EOT_TEXTS if t in self.ids), None)
        eom = self._id("eom", self.ids.get("<|eom_id|>"))
        eog |= {i for i in (self.eos_id, eot, eom) if i is not None}
        return eog


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """SentencePiece merges as BPE ranks: every split of a token into two tokens, the merged
    token's score first (llama.cpp merges the highest-scoring adjacent pair first)."""
    ids = {t: i for i, t in enumerate(tokens)}
    found: list[tuple[float, int, int, str, str]] = []
    for piece, score in zip(tokens, scores):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                found.append((-score, ids[left], ids[right], left, right))
    found.sort()
    return [(left, right) for _, _, _, left, right in found]


def _split_merge(merge: str) -> tuple[str, str]:
    cut = merge.find(" ", 1)  # llama.cpp's split: the first space after the first character
    return (merge[:cut], merge[cut + 1:]) if cut >= 0 else (merge, "")


def hf_tokenizer(file: GGUFFile) -> tuple[object, set[int]]:
    """The file's tokenizer as a Hugging Face fast tokenizer, and its end-of-generation ids."""
    from transformers import PreTrainedTokenizerFast

    spec = GGUFTokenizer(file)
    tok = spec.build()
    named = {"bos_token": spec.bos_id, "eos_token": spec.eos_id, "unk_token": spec.unk_id}
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, chat_template=file.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
        **{key: spec.tokens[i] for key, i in named.items() if i is not None})
    return hf, spec.eog_ids()
