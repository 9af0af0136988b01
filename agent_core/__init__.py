"""The agent lifecycle engine: immutable state, continuation criteria, lifecycle
observers, tools, model drivers, events and serialization.

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
    serialization  full round trip; slim: the compact snapshot (seed 004)
    drivers        the driver protocol, the scripted driver, the OpenAI-compatible one
    demo_tools     deterministic demo tools and the demo script
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
    "CallableCriterion",
    "CompositeObserver",
    "ContinuationCriteria",
    "ContinuationCriterion",
    "ContinuationDecision",
    "ContinuationEvaluated",
    "ContinuationEvaluation",
    "ContinuationOutcome",
    "CoreLifecycleObserver",
    "CumulativeExecutionTimeLimit",
    "CurrentExecution",
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
    "HookExecuted",
    "HookPoint",
    "HookStack",
    "HookStackObserver",
    "Message",
    "ModelDriver",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ModelTimeoutError",
    "PassThroughObserver",
    "RateLimitError",
    "ResponseContentCheck",
    "RetryLimit",
    "Role",
    "ScriptedDriver",
    "ScriptedFailure",
    "ScriptedResponse",
    "SerializationError",
    "SlimAgentStateSerializer",
    "SlimSerializationConfig",
    "StateUpdated",
    "StepCompleted",
    "StepError",
    "StepExecution",
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
    "Usage",
    "ValidationError",
    "__version__",
    "tool",
]

__version__ = "0.1.0"
