"""The agent lifecycle engine: immutable state, continuation criteria, lifecycle
observers, tools, model drivers, events and serialization; the orchestrators built on
it; the adapters to the broadcaster's envelope; and the application that serves runs.
See docs/agent_core.md.

Module map::

    continuation   decisions, evaluations, outcome, criteria collection (generic)
    criteria       built-in criteria (limits, error/finish/tool-call/content checks)
    error_policy   error policies, their criterion, the error handler
    steps          StepResult (generic), AgentStep, StepExecution, ToolExecution
    state          AgentState, ExecutionState, CurrentExecution
    tools          Tool, ToolRegistry, @tool
    events         typed events and the dispatcher
    lifecycle      the observer interface, CompositeObserver, CoreLifecycleObserver
    hooks          user hooks by priority
    loop           AgentLoop (the only place that awaits)
    agent/builder  Agent and AgentBuilder (the defaults)
    serialization  full round trip; slim: the compact snapshot
    messages, errors   messages, tool calls, usage; the error hierarchy
    drivers/       the driver protocol, the scripted driver, the OpenAI-compatible one

    orchestrators/
        process        ProcessState, StepRecord: the state of the orchestrators
        stepbystep     StepByStep (the generic base), state processors, StepContext
        tooluse        ToolUse;  chat: Chat;  collaboration: Collaboration
        turns          actors and selectors shared by Chat and Collaboration
        orchestration_events   their events
        process_serialization  full and slim serializers of process states
        routing/       capabilities, classifier, decider, memory (session), router
    adapters/
        broadcasting               agent events -> envelopes
        orchestration_broadcasting orchestrator events -> envelopes
    app/           runs, worker, demo, demo_tools, demo_routing, agui: the composition
                   root, the only part that imports the broadcaster's server modules
"""

from agent_core.agent import Agent
from agent_core.builder import AgentBuilder
from agent_core.continuation import (
    CallableCriterion,
    ContinuationCriteria,
    ContinuationCriterion,
    ContinuationDecision,
    ContinuationEvaluation,
    ContinuationOutcome,
    StopReason,
)
from agent_core.criteria import (
    CumulativeExecutionTimeLimit,
    ErrorPresenceCheck,
    ExecutionTimeLimit,
    FinishReasonCheck,
    ResponseContentCheck,
    RetryLimit,
    StepsLimit,
    TokenUsageLimit,
    ToolCallPresenceCheck,
)
from agent_core.drivers.base import ModelDriver, ModelRequest, ModelResponse
from agent_core.drivers.scripted import ScriptedDriver, ScriptedFailure, ScriptedResponse
from agent_core.error_policy import ErrorAction, ErrorHandler, ErrorPolicy, ErrorPolicyCriterion
from agent_core.errors import (
    AgentError,
    ErrorType,
    ModelError,
    ModelTimeoutError,
    RateLimitError,
    ToolError,
    ValidationError,
)
from agent_core.events import (
    AgentEvent,
    ContinuationEvaluated,
    EventDispatcher,
    ExecutionCompleted,
    ExecutionFailed,
    ExecutionStarted,
    HookExecuted,
    StateUpdated,
    StepCompleted,
    StepStarted,
    StreamChunk,
    TokenUsageReported,
    ToolCallBlocked,
    ToolCallCompleted,
    ToolCallStarted,
)
from agent_core.hooks import HookPoint, HookStack, HookStackObserver
from agent_core.lifecycle import (
    AgentObserver,
    CompositeObserver,
    CoreLifecycleObserver,
    PassThroughObserver,
)
from agent_core.loop import AgentLoop
from agent_core.messages import FinishReason, Message, Role, ToolCall, Usage
from agent_core.orchestrators.chat import (
    CallableParticipant,
    Chat,
    ChatState,
    ChatStep,
    ModelParticipant,
    Participant,
    ScriptedParticipant,
)
from agent_core.orchestrators.collaboration import (
    CallableCollaborator,
    Collaboration,
    CollaborationState,
    CollaborationStep,
    Collaborator,
    ModelCollaborator,
    ScriptedCollaborator,
)
from agent_core.orchestrators.orchestration_events import (
    ActorSelected,
    CapabilitySelected,
    CollaboratorSelected,
    IntentClassified,
    ParticipantSelected,
    ProcessCompleted,
    ProcessContinuationEvaluated,
    ProcessEvent,
    ProcessStarted,
    ProcessStateUpdated,
    ProcessStepCompleted,
    ProcessStepFailed,
    ProcessStepStarted,
    ReferencesResolved,
    SessionMemoryAppended,
)
from agent_core.orchestrators.process import CurrentStep, ProcessState, ProcessStep, StepRecord
from agent_core.orchestrators.process_serialization import (
    FullProcessStateSerializer,
    SlimProcessStateSerializer,
)
from agent_core.orchestrators.routing.capabilities import (
    Capability,
    CapabilityRegistry,
    CapabilityResult,
    FunctionCapability,
)
from agent_core.orchestrators.routing.classifier import (
    Intent,
    IntentClassifier,
    ModelIntentClassifier,
    Rule,
    RuleBasedClassifier,
)
from agent_core.orchestrators.routing.decider import (
    ContinuationDecider,
    ContinuationResult,
    DeciderCriterion,
    ModelContinuationDecider,
    NoOpContinuationDecider,
)
from agent_core.orchestrators.routing.memory import (
    InMemorySessionMemory,
    ModelReferenceResolver,
    ReferenceResolver,
    SessionContext,
    SessionMemory,
    SessionTurn,
)
from agent_core.orchestrators.routing.router import CapabilityRouter, RoutingState, RoutingStep
from agent_core.orchestrators.stepbystep import (
    AccumulateUsage,
    AppendStepMessages,
    StateProcessor,
    StepByStep,
    StepContext,
)
from agent_core.orchestrators.tooluse import ToolUse, ToolUseState
from agent_core.orchestrators.turns import (
    ActorReply,
    ActorSelector,
    ModelSelector,
    RoundRobinSelector,
    Selection,
    Turn,
)
from agent_core.serialization import (
    AgentStateSerializer,
    FullAgentStateSerializer,
    SerializationError,
)
from agent_core.slim import SlimAgentStateSerializer, SlimSerializationConfig
from agent_core.state import (
    AgentState,
    AgentStatus,
    CurrentExecution,
    ExecutionDecision,
    ExecutionState,
)
from agent_core.steps import (
    AgentStep,
    StepError,
    StepExecution,
    StepResult,
    StepType,
    ToolExecution,
)
from agent_core.tools import Tool, ToolRegistry, tool

__all__ = [
    "AccumulateUsage",
    "ActorReply",
    "ActorSelected",
    "ActorSelector",
    "Agent",
    "AgentBuilder",
    "AgentError",
    "AgentEvent",
    "AgentLoop",
    "AgentObserver",
    "AgentState",
    "AgentStateSerializer",
    "AgentStatus",
    "AgentStep",
    "AppendStepMessages",
    "CallableCollaborator",
    "CallableCriterion",
    "CallableParticipant",
    "Capability",
    "CapabilityRegistry",
    "CapabilityResult",
    "CapabilityRouter",
    "CapabilitySelected",
    "Chat",
    "ChatState",
    "ChatStep",
    "Collaboration",
    "CollaborationState",
    "CollaborationStep",
    "Collaborator",
    "CollaboratorSelected",
    "CompositeObserver",
    "ContinuationCriteria",
    "ContinuationCriterion",
    "ContinuationDecider",
    "ContinuationDecision",
    "ContinuationEvaluated",
    "ContinuationEvaluation",
    "ContinuationOutcome",
    "ContinuationResult",
    "CoreLifecycleObserver",
    "CumulativeExecutionTimeLimit",
    "CurrentExecution",
    "CurrentStep",
    "DeciderCriterion",
    "ErrorAction",
    "ErrorHandler",
    "ErrorPolicy",
    "ErrorPolicyCriterion",
    "ErrorPresenceCheck",
    "ErrorType",
    "EventDispatcher",
    "ExecutionCompleted",
    "ExecutionDecision",
    "ExecutionFailed",
    "ExecutionStarted",
    "ExecutionState",
    "ExecutionTimeLimit",
    "FinishReason",
    "FinishReasonCheck",
    "FullAgentStateSerializer",
    "FullProcessStateSerializer",
    "FunctionCapability",
    "HookExecuted",
    "HookPoint",
    "HookStack",
    "HookStackObserver",
    "InMemorySessionMemory",
    "Intent",
    "IntentClassified",
    "IntentClassifier",
    "Message",
    "ModelCollaborator",
    "ModelContinuationDecider",
    "ModelDriver",
    "ModelError",
    "ModelIntentClassifier",
    "ModelParticipant",
    "ModelReferenceResolver",
    "ModelRequest",
    "ModelResponse",
    "ModelSelector",
    "ModelTimeoutError",
    "NoOpContinuationDecider",
    "Participant",
    "ParticipantSelected",
    "PassThroughObserver",
    "ProcessCompleted",
    "ProcessContinuationEvaluated",
    "ProcessEvent",
    "ProcessStarted",
    "ProcessState",
    "ProcessStateUpdated",
    "ProcessStep",
    "ProcessStepCompleted",
    "ProcessStepFailed",
    "ProcessStepStarted",
    "RateLimitError",
    "ReferenceResolver",
    "ReferencesResolved",
    "ResponseContentCheck",
    "RetryLimit",
    "Role",
    "RoundRobinSelector",
    "RoutingState",
    "RoutingStep",
    "Rule",
    "RuleBasedClassifier",
    "ScriptedCollaborator",
    "ScriptedDriver",
    "ScriptedFailure",
    "ScriptedParticipant",
    "ScriptedResponse",
    "Selection",
    "SerializationError",
    "SessionContext",
    "SessionMemory",
    "SessionMemoryAppended",
    "SessionTurn",
    "SlimAgentStateSerializer",
    "SlimProcessStateSerializer",
    "SlimSerializationConfig",
    "StateProcessor",
    "StateUpdated",
    "StepByStep",
    "StepCompleted",
    "StepContext",
    "StepError",
    "StepExecution",
    "StepRecord",
    "StepResult",
    "StepStarted",
    "StepType",
    "StepsLimit",
    "StopReason",
    "StreamChunk",
    "TokenUsageLimit",
    "TokenUsageReported",
    "Tool",
    "ToolCall",
    "ToolCallBlocked",
    "ToolCallCompleted",
    "ToolCallPresenceCheck",
    "ToolCallStarted",
    "ToolError",
    "ToolExecution",
    "ToolRegistry",
    "ToolUse",
    "ToolUseState",
    "Turn",
    "Usage",
    "ValidationError",
    "__version__",
    "tool",
]

__version__ = "0.1.0"
