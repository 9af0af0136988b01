// Why a step's continuation went the way it did: which criterion won, and by which
// precedence rule (docs/agent_core.md, "When a run is failed, and who decided";
// agent_core/continuation.py). Pure: a continuation payload in, {rule, text} out.
//
// The rules, in order: any forbid stops the run, and among forbids an error (stop
// reason "error") decides before any limit, else the first forbid; with no forbid a
// request continues (the first request decides; a request beats a stop); otherwise the
// first criterion that proposed the stop decides; allows alone continue, and no
// evaluations at all stop, both "resolved by aggregate".

const isError = (evaluation) => evaluation.stop_reason === "error";

function stopped(cont, evaluations, who) {
  const forbids = evaluations.filter((e) => e.decision === "forbid");
  if (forbids.length) {
    const limits = forbids.filter((e) => !isError(e) && e.criterion !== who).map((e) => e.criterion);
    const deciding = evaluations.find((e) => e.criterion === who && (e.decision === "forbid" || isError(e)));
    if (deciding && isError(deciding) && limits.length) {
      return {
        rule: "error-wins",
        text: `${who} won: an error wins over any limit that forbade in the same evaluation `
          + `(${limits.join(", ")} forbade too), so the run stops for error and is failed.`,
      };
    }
    if (deciding && isError(deciding)) {
      return { rule: "error-forbid", text: `${who} won: any forbid stops the run; this one is an error, so the run is failed.` };
    }
    if (forbids.length > 1) {
      return {
        rule: "first-forbid",
        text: `${who} won: any forbid stops the run; ${forbids.length} forbade and none for an error, so the first forbid decides (stop reason ${cont.stop_reason ?? "guard"}).`,
      };
    }
    return { rule: "only-forbid", text: `${who} won: any forbid stops the run (stop reason ${cont.stop_reason ?? "guard"}).` };
  }
  if (!evaluations.length) {
    return { rule: "no-evaluations", text: "No criterion evaluated this step: no evaluations at all means stop (resolved by aggregate)." };
  }
  return {
    rule: "first-stop",
    text: `${who} won: nothing forbade and nothing requested another step, so the first criterion that proposed the stop decides.`,
  };
}

function continued(evaluations, who) {
  const requests = evaluations.filter((e) => e.decision === "request");
  if (requests.length) {
    const more = requests.length > 1 ? ` (the first of ${requests.length} requests)` : "";
    return {
      rule: "first-request",
      text: `${who} won: nothing forbade, and a request continues the run, beating any stop${more}.`,
    };
  }
  return { rule: "allows-only", text: "No criterion forbade, requested or stopped: allows alone continue the run (resolved by aggregate)." };
}

/** {rule, text} for a continuation payload (agent.continuation, or a step's summary). */
export function explainContinuation(cont) {
  const who = cont.resolved_by ?? "aggregate";
  if (!Array.isArray(cont.evaluations)) {
    return {
      rule: "summary",
      text: `${who} decided. The precedence rule shows with the evaluations (continuation trace on).`,
    };
  }
  return cont.should_continue ? continued(cont.evaluations, who) : stopped(cont, cont.evaluations, who);
}
