"""The agent API: a class with ``rollout(task, resources, rollout)`` (as Agent Lightning's ``LitAgent``), or a plain
function whose parameters say what it needs. Sync or async, either way.

A function may ask, by parameter name, for:
``task`` (the rollout's input), ``resources`` (the named resources of the attempt), ``rollout`` (the
``AttemptedRollout``), ``llm`` (the first LLM resource, a proxied one resolved to this attempt's URL),
``prompt_template`` (the first prompt template), ``ctx`` (the :class:`AttemptContext`, to record spans).

It returns ``None`` (rewards were emitted in the trace) or a number (the final reward, emitted for it).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from litstream.schemas.models import LLM, AttemptedRollout, NamedResources, PromptTemplate, ProxyLLM

from .sdk import AttemptContext

INJECTABLE = ("task", "resources", "rollout", "llm", "prompt_template", "ctx")


@dataclass(frozen=True)
class AttemptInputs:
    """Everything an agent can be given for one attempt."""

    task: Any
    resources: NamedResources
    rollout: AttemptedRollout
    ctx: AttemptContext

    @property
    def llm(self) -> LLM | None:
        for res in self.resources.values():
            if isinstance(res, ProxyLLM):  # the proxy attributes calls to this attempt through its URL
                return LLM(endpoint=res.get_base_url(self.rollout.rollout_id, self.rollout.attempt.attempt_id),
                           model=res.model, api_key=res.api_key, sampling_parameters=res.sampling_parameters)
            if isinstance(res, LLM):
                return res
        return None

    @property
    def prompt_template(self) -> PromptTemplate | None:
        return next((r for r in self.resources.values() if isinstance(r, PromptTemplate)), None)


class LitAgent:
    """Subclass and implement ``rollout`` (or ``rollout_async``); training and validation default to it."""

    def rollout(self, task: Any, resources: NamedResources, rollout: AttemptedRollout) -> float | None:
        raise TypeError(f"{type(self).__name__} implements neither rollout nor rollout_async")

    async def rollout_async(self, task: Any, resources: NamedResources, rollout: AttemptedRollout) -> float | None:
        return await asyncio.to_thread(self.rollout, task, resources, rollout)

    def training_rollout(self, task: Any, resources: NamedResources, rollout: AttemptedRollout) -> Any:
        return self._dispatch(task, resources, rollout)

    def validation_rollout(self, task: Any, resources: NamedResources, rollout: AttemptedRollout) -> Any:
        return self._dispatch(task, resources, rollout)

    def _dispatch(self, task: Any, resources: NamedResources, rollout: AttemptedRollout) -> Any:
        if type(self).rollout_async is not LitAgent.rollout_async:
            return self.rollout_async(task, resources, rollout)
        return self.rollout(task, resources, rollout)

    def run(self, inputs: AttemptInputs) -> float | None:
        """Run one attempt to its end in the calling thread (an async agent gets its own event loop)."""
        method = self.training_rollout if inputs.rollout.mode in (None, "train") else self.validation_rollout
        result = method(inputs.task, inputs.resources, inputs.rollout)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        return result  # type: ignore[no-any-return]


async def _await(awaitable: Any) -> Any:
    return await awaitable


class FunctionAgent(LitAgent):
    """A function as an agent: its parameter names choose what it is given."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        params = inspect.signature(fn).parameters
        unknown = [p for p in params if p not in INJECTABLE]
        if unknown:
            raise TypeError(f"agent {fn.__name__}: cannot provide parameter(s) {unknown}; "
                            f"an agent function may take any of {INJECTABLE}")
        self.wants = list(params)
        self.__name__ = getattr(fn, "__name__", "agent")

    def run(self, inputs: AttemptInputs) -> float | None:
        kwargs = {name: getattr(inputs, name) for name in self.wants}
        result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            result = asyncio.run(_await(result))
        return result  # type: ignore[no-any-return]


def litagent(fn: Callable[..., Any]) -> FunctionAgent:
    """Decorator: ``@litagent def agent(task, llm, ctx): ...``."""
    return FunctionAgent(fn)


def as_agent(obj: Any) -> LitAgent:
    """A LitAgent instance, a LitAgent class, or a function, as a LitAgent."""
    if isinstance(obj, LitAgent):
        return obj
    if inspect.isclass(obj) and issubclass(obj, LitAgent):
        return obj()
    if callable(obj):
        return FunctionAgent(obj)
    raise TypeError(f"{obj!r} is not an agent: give a LitAgent or a function")
