"""The stack, declared once: its roles, the ``litstream`` command that runs each, what says each one is ready,
and the order they start in.

``litstream up``, the quick slice (``litstream demo --slice``), ``litstream train`` and the closed-loop demo
(:class:`~litstream.app.fit.Trainer`), the store behind the REST APIs (:meth:`Stack.start_store`) and the
tests' fixtures compose their stacks from these declarations, in one order (:data:`ORDER`); the supervisor
(``stack.py``) starts roles in that order and stops them in reverse. The pipeline comes first (the lifecycle
processor, then the span sink), then what learns from it (the triplet processor, the trainer), what serves it
(the policy server, which serves the trainer's first version when there is a trainer, and the gateway), and the
runners last, once there is something to run for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from litstream.infra.settings import Settings

ARITHMETIC_AGENT = "litstream.workers.demo_agent:arithmetic_agent"  # the runner's default agent
TOY_POLICY_AGENT = "litstream.workers.policy_agent:toy_policy_agent"  # runs the trained policy in-process
LOAD_TIMEOUT_S = 600.0  # a role that loads a model (SmolLM2) takes a while to be ready
ORDER = ("lifecycle", "span-sink", "triplets", "trainer", "policy-server", "gateway", "runner")


@dataclass(frozen=True)
class Role:
    """One process of the stack."""

    name: str  # its name in the stack: its log is <data dir>/logs/<name>.log
    args: tuple[str, ...]  # its `litstream` command line
    health: str  # the role it beats as (`litstream healthcheck <health>`)
    ready_key: str | None = None  # ready once its beat has this key (else once a beat no longer says starting)
    ready_timeout_s: float = 60.0

    def named(self, name: str) -> Role:
        """The same role under another name (a second runner, a restarted trainer)."""
        return replace(self, name=name)


LIFECYCLE = Role("lifecycle", ("process", "lifecycle"), "lifecycle")
SPAN_SINK = Role("span-sink", ("process", "span-sink"), "span-sink", ready_key="inserted")
TRIPLETS = Role("triplets", ("process", "triplets"), "triplets")
PIPELINE = (LIFECYCLE, SPAN_SINK)  # every stack: rollouts folded, spans stored


def trainer(*options: str) -> Role:
    """The GRPO trainer (``litstream process trainer --help`` lists the options); ready once it published."""
    return Role("trainer", ("process", "trainer", *options), "trainer", "version", LOAD_TIMEOUT_S)


def gateway(host: str, port: int) -> Role:
    return Role("gateway", ("gateway", "--host", host, "--port", str(port)), "gateway")


def policy_server(*options: str) -> Role:
    """The policy endpoint; ready once its beat names its URL (the bound port, when ``--port 0``)."""
    return Role("policy-server", ("policy-server", *options), "policy-server", "url", LOAD_TIMEOUT_S)


def runner(agent: str | None = None, concurrency: int | None = None, name: str = "runner") -> Role:
    args = ("runner", *(("--agent", agent) if agent else ()),
            *(("--concurrency", str(concurrency)) if concurrency is not None else ()))
    return Role(name, args, "runner")


def in_order(roles: list[Role]) -> list[Role]:
    """``roles`` in the stack's start order (:data:`ORDER`; several of one kind keep theirs)."""
    return sorted(roles, key=lambda role: ORDER.index(role.health))


def up_roles(settings: Settings, runners: bool, with_gateway: bool, train: bool,
             with_policy_server: bool = True) -> list[Role]:
    """``litstream up``'s stack, in start order."""
    roles = list(PIPELINE)
    if train:  # triplets only feed the trainer
        roles += [TRIPLETS, trainer()]
    if with_policy_server:  # the policy endpoint; it does not publish itself (the toy agent runs in-process)
        roles.append(policy_server("--model", "tiny", "--host", settings.policy_server_host,
                                   "--port", str(settings.policy_server_port)))
    if with_gateway:
        roles.append(gateway(settings.gateway_host, settings.gateway_port))
    if runners:
        roles.append(runner(TOY_POLICY_AGENT if train else ARITHMETIC_AGENT))
    return in_order(roles)


def store_roles(host: str, port: int) -> list[Role]:
    """The store behind the REST APIs: the pipeline and the gateway on ``host:port``."""
    return in_order([*PIPELINE, gateway(host, port)])


def slice_roles(concurrency: int) -> list[Role]:
    """The quick slice: the pipeline and a runner with the arithmetic agent."""
    return in_order([*PIPELINE, runner(concurrency=concurrency)])
