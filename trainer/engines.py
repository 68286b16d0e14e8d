"""Inference engines that generate rollouts and take new policy versions: in-process torch, or a vLLM server.

``Generation.logprobs`` holds, for each sampled token, its log-prob under the distribution it was sampled from:
the softmax of the logits divided by the temperature (before top-p; greedy decoding, temperature 0, reports the
untempered softmax). That is the behaviour policy GRPO's ratio needs as the old log-prob, and the learner scores
tokens the same way (``LearnerConfig.temperature``, set to the temperature the trainer publishes). vLLM reports the
same when started with ``--logprobs-mode processed_logprobs`` (``vllm_server_command`` does; its default,
``raw_logprobs``, is the untempered softmax). A response that stopped on eos includes the eos token (with its
log-prob), so the policy learns to stop.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self, runtime_checkable

import torch
import torch.nn.functional as F

from litstream.infra.processes import stop_process

from .checkpoint import load_checkpoint, load_weights_into
from .constrained import (
    TokenConstraint,
    ToolCallGrammar,
    allowed_tokens,
    compile_tool_call_grammar,
    tool_call_lark,
)
from .policy import logits_width, takes_logits_to_keep
from .tokenizer import Tokenizer


@dataclass
class Generation:
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (eos) | "length" (| "abort": a vLLM request cut short)


@runtime_checkable
class InferenceEngine(Protocol):
    @property
    def version(self) -> int: ...

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = None,
                 grammar: ToolCallGrammar | None = None) -> list[Generation]:
        """With ``grammar``, every sequence is constrained to it (``trainer.constrained``); the log-probs are
        those of the distribution each token was drawn from: the tempered one, masked to what the grammar allowed
        and renormalised (the learner replays the masks to score such a response the same way)."""
        ...

    def apply_version(self, version: int, checkpoint_dir: str | Path) -> float:
        """Serve the weights in ``checkpoint_dir`` as ``version`` from now on; returns the seconds it took."""
        ...

    def close(self) -> None: ...


# --- torch ---------------------------------------------------------------------------------------------------


class TorchEngine:
    """Batched sampling with a KV cache, in this process. Not thread-safe: one generate or apply at a time."""

    def __init__(self, model: Any, tokenizer: Tokenizer, version: int = 0) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self._version = version
        # The prompt's pass needs the logits of its last position only: a Hugging Face model that takes
        # ``logits_to_keep`` skips the output layer on the others (for a short answer, the largest part of the
        # prompt's cost after the blocks: 49,152 logits a position for SmolLM2).
        self._last_logits: dict[str, int] = {"logits_to_keep": 1} if takes_logits_to_keep(model) else {}

    @classmethod
    def from_checkpoint(cls, path: str | Path, version: int | None = None) -> TorchEngine:
        """The checkpoint's weights, at the version it was saved as or ``version``."""
        ck = load_checkpoint(path, with_optimizer=False)
        return cls(ck.model, ck.tokenizer, ck.version if version is None else version)

    @property
    def version(self) -> int:
        return self._version

    def apply_version(self, version: int, checkpoint_dir: str | Path) -> float:
        t0 = time.perf_counter()
        load_weights_into(self.model, checkpoint_dir)
        self._version = version
        return time.perf_counter() - t0

    def close(self) -> None:
        pass

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = None,
                 grammar: ToolCallGrammar | None = None) -> list[Generation]:
        """Samples a response for each prompt. With ``grammar`` (a forced tool call) each sequence is constrained
        to it through llguidance; ValueError when the grammar cannot be compiled."""
        constraints = None
        if grammar is not None and prompts:
            compiled = compile_tool_call_grammar(self.tokenizer, grammar, self._vocab_size)
            constraints = compiled.start(len(prompts))
        return self.generate_constrained(prompts, max_new_tokens, temperature, top_p, seed, constraints)

    @torch.no_grad()
    def generate_constrained(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
                             top_p: float = 1.0, seed: int | None = None,
                             constraints: Sequence[TokenConstraint] | None = None) -> list[Generation]:
        """``generate`` with one ``TokenConstraint`` per prompt (or none): each step's logits are masked to what the
        sequence's constraint allows before sampling; temperature and top-p apply over the allowed tokens. The
        log-probs reported are those of the masked, renormalised distribution (as vLLM reports them)."""
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        if constraints is not None and len(constraints) != len(prompts):
            raise ValueError(f"{len(constraints)} constraints for {len(prompts)} prompts")
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        pad, eos = self.tokenizer.pad_id, self.tokenizer.eos_id
        B = len(prompts)
        logits, past, attn, next_pos = self._prompt_pass(prompts)
        tokens: list[list[int]] = [[] for _ in range(B)]
        lps: list[list[float]] = [[] for _ in range(B)]
        done = torch.zeros(B, dtype=torch.bool)
        for step in range(max_new_tokens):
            allowed = None
            if constraints is not None:
                live = [None if done[b] else c for b, c in enumerate(constraints)]
                allowed = torch.from_numpy(allowed_tokens(live, logits.shape[-1], eos))
            nxt, chosen = _pick(logits, temperature, top_p, gen, allowed)
            for b in range(B):
                if not done[b]:
                    tokens[b].append(int(nxt[b]))
                    lps[b].append(float(chosen[b]))
                    if constraints is not None and int(nxt[b]) != eos:
                        constraints[b].accept(int(nxt[b]))
            done |= nxt == eos
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            feed = torch.where(done, torch.full_like(nxt, pad), nxt).unsqueeze(1)
            attn = torch.cat([attn, torch.ones((B, 1), dtype=torch.long)], dim=1)
            out = self.model(input_ids=feed, attention_mask=attn, position_ids=next_pos, past_key_values=past,
                             use_cache=True)
            past, logits = out.past_key_values, out.logits[:, -1, :]
            next_pos = next_pos + 1
        return [self._generation(p, tokens[b], lps[b]) for b, p in enumerate(prompts)]

    def _prompt_pass(self, prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """The prompts' forward pass, left-padded (every row's next token comes from the last column): the last
        position's logits, the KV cache, the attention mask and the next positions. A prefix every prompt shares
        (an agent's system prompt and tool definitions, or one prompt's ``n`` choices) is computed once and its
        cache repeated for each row; the rows' own tokens follow it, left-padded among themselves."""
        shared = min(common_prefix_length(prompts), min(len(p) for p in prompts) - 1)
        if len(prompts) < 2 or shared < MIN_SHARED_PREFIX:
            return self._rows_pass(prompts, 0, None)
        ids = torch.tensor([list(prompts[0][:shared])], dtype=torch.long)
        past = self.model(input_ids=ids, use_cache=True, **self._last_logits).past_key_values
        if not callable(getattr(past, "batch_repeat_interleave", None)):  # a cache that cannot be repeated
            return self._rows_pass(prompts, 0, None)
        past.batch_repeat_interleave(len(prompts))
        return self._rows_pass([p[shared:] for p in prompts], shared, past)

    def _rows_pass(self, rows: Sequence[Sequence[int]], shared: int,
                   past: Any) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
        """``rows`` left-padded after ``shared`` cached positions (none: no cache yet)."""
        pad = self.tokenizer.pad_id
        B, P = len(rows), max(len(p) for p in rows)
        ids = torch.full((B, P), pad, dtype=torch.long)
        attn = torch.zeros((B, shared + P), dtype=torch.long)
        attn[:, :shared] = 1
        for b, p in enumerate(rows):
            ids[b, P - len(p):] = torch.tensor(list(p), dtype=torch.long)
            attn[b, shared + P - len(p):] = 1
        pos = (attn.cumsum(1) - 1).clamp(min=0)[:, shared:]
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, past_key_values=past, use_cache=True,
                         **self._last_logits)
        return out.logits[:, -1, :], out.past_key_values, attn, pos[:, -1:] + 1

    def _generation(self, prompt: Sequence[int], tokens: list[int], logprobs: list[float]) -> Generation:
        stopped = bool(tokens) and tokens[-1] == self.tokenizer.eos_id
        return Generation(prompt_token_ids=list(prompt), token_ids=tokens, logprobs=logprobs,
                          text=self.tokenizer.decode(tokens), finish_reason="stop" if stopped else "length")

    @property
    def _vocab_size(self) -> int:
        """The width of the model's logits (the masks' width)."""
        return logits_width(self.model)


MIN_SHARED_PREFIX = 16  # a shorter common prefix is not worth a pass of its own


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """How many leading tokens every prompt shares."""
    first, n = prompts[0], min(len(p) for p in prompts)
    for other in prompts[1:]:
        k = 0
        while k < n and other[k] == first[k]:
            k += 1
        n = k
        if not n:
            break
    return n


def _pick(logits: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None,
          allowed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The next tokens and their log-probs under the tempered distribution. With ``allowed`` (a boolean mask), the
    tokens are drawn from that distribution restricted to the allowed ones and renormalised (top-p then applies
    over them), and the log-probs reported are those of the restricted one."""
    logp = tempered_logprobs(logits, temperature)
    if allowed is not None:
        logp = F.log_softmax(logp.masked_fill(~allowed, float("-inf")), dim=-1)
    nxt = _sample(logp, temperature, top_p, gen)
    return nxt, logp.gather(1, nxt.unsqueeze(1)).squeeze(1)


def tempered_logprobs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-softmax of ``logits / temperature``; untempered for temperature <= 0 (greedy)."""
    logits = logits.float()
    return F.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)


def _sample(logp: torch.Tensor, temperature: float, top_p: float, gen: torch.Generator | None) -> torch.Tensor:
    """A token from ``logp`` (already at the temperature), argmax when greedy, within top-p when below 1."""
    if temperature <= 0:
        return logp.argmax(dim=-1)
    probs = logp.exp()
    if top_p < 1.0:
        sp, si = probs.sort(dim=-1, descending=True)
        cut = sp.cumsum(-1) - sp > top_p  # drop tokens once the mass before them exceeds top_p
        sp = sp.masked_fill(cut, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, si, sp)
    return torch.multinomial(probs, 1, generator=gen).squeeze(1)


# --- vLLM ----------------------------------------------------------------------------------------------------


class VllmEngine:
    """Drives a vLLM OpenAI-compatible server: token-id prompts in, token ids and their log-probs out.

    Hot-swapping weights needs the server started with ``VLLM_SERVER_DEV_MODE=1`` (it exposes ``/pause``,
    ``/collective_rpc``, ``/reset_prefix_cache``, ``/update_weight_version``, ``/resume``), and a checkpoint
    directory the server can read (same filesystem) with untied embeddings.

    ``pause_mode`` is what a swap does to generations in flight: ``"wait"`` (default) lets them finish on the old
    weights, so every response comes from one version; ``"abort"`` cuts them short (finish_reason ``"abort"``);
    ``"keep"`` freezes them and continues them on the new weights (responses that mix two versions).

    A forced tool call (``generate(grammar=...)``) is constrained by the server (``completion_body``). vLLM masks
    the logits with the grammar before its sampler computes log-probs (in either logprobs mode), so the log-probs
    of a constrained response are those of the masked, renormalised distribution, as TorchEngine reports them.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, version: int = 0,
                 timeout: float = 300.0, max_parallel: int = 8, pause_mode: str = "wait") -> None:
        root = base_url.rstrip("/")
        self.root = root.removesuffix("/v1")
        self.model = model
        self.api_key = api_key
        self._version = version
        self.timeout = timeout
        self.max_parallel = max_parallel
        if pause_mode not in ("wait", "abort", "keep"):
            raise ValueError(f"pause_mode must be wait | abort | keep, not {pause_mode!r}")
        self.pause_mode = pause_mode

    @property
    def version(self) -> int:
        return self._version

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body or {}).encode()
        req = urllib.request.Request(self.root + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"POST {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from None
        return json.loads(raw) if raw.strip() else None

    def _get(self, path: str) -> Any:
        req = urllib.request.Request(self.root + path)
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw.strip() else None

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = None,
                 grammar: ToolCallGrammar | None = None) -> list[Generation]:
        """With ``grammar``, each request carries it as vLLM's structured output (``completion_body``)."""
        if not prompts:
            return []
        lark = tool_call_lark(grammar) if grammar is not None else None  # a bad grammar fails here, not remotely
        if seed is None:  # one batched request
            return self._complete([list(p) for p in prompts], max_new_tokens, temperature, top_p, None, lark)
        # A request's seed applies to every prompt in it, so identical prompts (a GRPO group) would sample
        # identical responses: one request per prompt, seeds seed, seed + 1, ...
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(prompts))) as pool:
            futs = [pool.submit(self._complete, [list(p)], max_new_tokens, temperature, top_p, seed + i, lark)
                    for i, p in enumerate(prompts)]
            return [f.result()[0] for f in futs]

    def _complete(self, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                  seed: int | None, lark: str | None = None) -> list[Generation]:
        body = completion_body(self.model, prompts, max_new_tokens, temperature, top_p, seed, lark)
        resp = self._post("/v1/completions", body)
        out: list[Generation | None] = [None] * len(prompts)
        for choice in resp["choices"]:
            i = int(choice["index"])
            out[i] = parse_choice(choice, prompts[i])
        if any(g is None for g in out):
            raise RuntimeError("the server answered fewer choices than prompts")
        return [g for g in out if g is not None]

    def apply_version(self, version: int, checkpoint_dir: str | Path) -> float:
        path = Path(checkpoint_dir).resolve()
        # vLLM reads a path that is not a local directory as a hub repo id, and a failed reload_weights kills the
        # server's engine: check the directory here first (on a remote server it must exist at the same path).
        if _is_local(self.root) and not (path.is_dir() and any(path.glob("*.safetensors"))):
            raise FileNotFoundError(f"no *.safetensors checkpoint in {path}")
        t0 = time.perf_counter()
        self._post(f"/pause?mode={self.pause_mode}")
        try:
            self._post("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
            self._post("/reset_prefix_cache")  # cached KV blocks were computed by the old weights
            self._post("/update_weight_version", {"new_version": str(version)})
        except BaseException:
            try:
                self._post("/resume")
            except Exception:  # the reload's error is the one to report
                pass
            raise
        self._post("/resume")
        self._version = version
        return time.perf_counter() - t0

    def weight_info(self) -> Any:
        """The server's ``/weight_info``: ``{"weight_version": "<version>"}`` ("default" before any swap)."""
        return self._get("/weight_info")

    def close(self) -> None:
        pass


def completion_body(model: str, prompts: list[list[int]], max_new_tokens: int, temperature: float, top_p: float,
                    seed: int | None = None, grammar: ToolCallGrammar | str | None = None) -> dict[str, Any]:
    """The JSON body of vLLM's ``POST /v1/completions`` for token-id prompts. ``logprobs`` 0: only the sampled
    token's log-prob; ``return_token_ids`` (vLLM >= 0.10.2) puts the ids in ``choice["token_ids"]``,
    ``return_tokens_as_token_ids`` makes older servers spell them ``token_id:N``. With ``grammar`` (a
    ``ToolCallGrammar``, or its ``tool_call_lark`` text), every sequence is constrained to it through
    ``structured_outputs.grammar``: Lark in llguidance's dialect, which the server's guidance backend compiles
    (``vllm_server_command`` selects that backend; vLLM's default, auto, would hand the text to xgrammar, which
    parses it but leaves the JSON's whitespace free)."""
    body: dict[str, Any] = {
        "model": model, "prompt": prompts, "max_tokens": max_new_tokens, "temperature": temperature,
        "top_p": top_p, "logprobs": 0, "return_tokens_as_token_ids": True, "return_token_ids": True,
        "skip_special_tokens": False,
    }
    if seed is not None:
        body["seed"] = seed
    if grammar is not None:
        body["structured_outputs"] = {
            "grammar": grammar if isinstance(grammar, str) else tool_call_lark(grammar)}
    return body


def _is_local(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


def parse_choice(choice: dict[str, Any], prompt: list[int]) -> Generation:
    """One completion choice into a Generation: token ids from ``token_ids`` (newer vLLM, ``return_token_ids``)
    or from ``token_id:N`` strings (``return_tokens_as_token_ids``), log-probs from ``token_logprobs``. A finish
    reason other than stop / length (e.g. "abort") is passed through."""
    lp = choice.get("logprobs") or {}
    strs = lp.get("tokens") or []
    logprobs = [float(x) if x is not None else 0.0 for x in (lp.get("token_logprobs") or [])]
    ids = choice.get("token_ids")
    if ids is None:
        ids = [int(s.removeprefix("token_id:")) for s in strs]
    ids = [int(i) for i in ids]
    if len(logprobs) != len(ids):
        raise RuntimeError(f"{len(ids)} tokens but {len(logprobs)} log-probs: is logprobs enabled on the server?")
    finish = choice.get("finish_reason") or "length"
    return Generation(prompt_token_ids=list(prompt), token_ids=ids, logprobs=logprobs,
                      text=choice.get("text") or "", finish_reason="stop" if finish == "stop" else finish)


@dataclass
class VllmServer:
    process: subprocess.Popen[bytes]
    base_url: str  # ends with /v1
    model: str
    log_path: Path
    version: int = 0  # the weight version the server reports at start
    start_seconds: float = 0.0  # launch to first answered completion

    def engine(self, version: int | None = None, **kwargs: Any) -> VllmEngine:
        return VllmEngine(self.base_url, self.model, version=self.version if version is None else version, **kwargs)

    def stop(self, timeout: float = 30.0) -> None:
        stop_process(self.process, timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def vllm_server_command(model_dir: str | Path, port: int, served_name: str, python: str | None = None,
                        max_model_len: int | None = None, extra_args: Sequence[str] = ()) -> list[str]:
    """The server's command line. ``python -m vllm.entrypoints.openai.api_server`` rather than the ``vllm``
    script (which fails on the CPU build); float32 and eager mode (no compile step) on CPU; ``--generation-config
    vllm`` so a ``generation_config.json`` in the checkpoint does not change sampling defaults behind the
    requests' back; ``--logprobs-mode processed_logprobs`` (vLLM >= 0.10.1) so that the reported log-probs are at
    the sampling temperature, as TorchEngine's; the guidance (llguidance) structured-output backend, which takes
    the forced tool calls' grammars as TorchEngine compiles them."""
    cmd = [python or sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--enforce-eager", "--generation-config", "vllm",
           "--logprobs-mode", "processed_logprobs",  # log-probs at the sampling temperature, as the learner's
           # Forced tool calls (completion_body's grammar) are llguidance Lark grammars.
           "--structured-outputs-config.backend", "guidance"]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    return cmd + list(extra_args)


def vllm_server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    # CPU backend: a small KV cache (GiB); the model must load from disk; dev mode exposes the hot-swap routes.
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


def start_vllm_server(model_dir: str | Path, served_name: str = "policy", port: int | None = None,
                      python: str | None = None, log_path: str | Path | None = None, ready_timeout: float = 300.0,
                      max_model_len: int | None = None, extra_args: Sequence[str] = (),
                      version: int | None = None) -> VllmServer:
    """Starts ``vllm.entrypoints.openai.api_server`` on CPU for ``model_dir``, waits until it answers a
    completion, and sets its weight version to ``version`` (default: the checkpoint's ``trainer_state.json``
    version, else 0). ``python`` is the interpreter that has vLLM (e.g. a separate virtualenv's)."""
    if version is None:
        state = Path(model_dir) / "trainer_state.json"
        version = int(json.loads(state.read_text())["version"]) if state.exists() else 0
    port = port or _free_port()
    log = Path(log_path) if log_path else Path(model_dir).parent / f"vllm-{port}.log"
    cmd = vllm_server_command(model_dir, port, served_name, python, max_model_len, extra_args)
    t0 = time.perf_counter()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=vllm_server_env())
    server = VllmServer(process=proc, base_url=f"http://127.0.0.1:{port}/v1", model=served_name, log_path=log,
                        version=version)

    def failed(why: str) -> RuntimeError:
        text = log.read_text(errors="replace")
        # The root cause is an exception line deep in the workers' tracebacks, well before the log's end.
        msgs = (ln.split("] ", 1)[-1] for ln in text.splitlines())
        causes = list(dict.fromkeys(m for m in msgs if re.match(r"[\w.]*(Error|Exception): ", m)))
        return RuntimeError(f"{why} (log {log})\n" + "\n".join(causes[-5:]) + "\n...\n" + text[-2000:])

    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if proc.poll() is not None:
                raise failed(f"vLLM exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"vLLM not ready after {ready_timeout} s (log: {log})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        eng = server.engine()
        try:
            # The API answers before the engine has run a step: one token shows the model actually runs here
            # (e.g. vLLM's CPU attention rejects some head sizes only at the first request).
            eng._complete([[0]], 1, 1.0, 1.0, 0)
            eng._post("/update_weight_version", {"new_version": str(version)})
        except (RuntimeError, OSError) as exc:
            raise failed(f"vLLM started but cannot serve: {exc}") from None
        server.start_seconds = time.perf_counter() - t0
        return server
    except BaseException:
        server.stop()
        raise


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- choosing an engine --------------------------------------------------------------------------------------


def engine_for_resource(resource: Any, version: int = 0) -> InferenceEngine:
    """The engine an LLM resource names: ``torch://<checkpoint dir>`` -> TorchEngine, ``http(s)://`` ->
    VllmEngine. An explicit ``engine`` field ("torch" | "vllm") wins. Takes ``schemas.models.LLM``, an
    ``events.NamedResourceRecord`` or a dict with the same fields."""
    get = resource.get if isinstance(resource, dict) else lambda k, d=None: getattr(resource, k, d)
    endpoint = get("endpoint") or ""
    kind = (get("engine") or "").lower() or None
    if kind is None:
        if endpoint.startswith("torch://"):
            kind = "torch"
        elif endpoint.startswith(("http://", "https://")):
            kind = "vllm"
        else:
            raise ValueError(f"cannot tell the engine of endpoint {endpoint!r}")
    if kind == "torch":
        return TorchEngine.from_checkpoint(endpoint.removeprefix("torch://"))
    if kind == "vllm":
        return VllmEngine(endpoint, get("model") or "", api_key=get("api_key"), version=version)
    raise ValueError(f"unknown engine {kind!r} (torch | vllm)")
