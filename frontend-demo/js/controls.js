// The run form's hints, from GET /api/demo/config: the step limit each mode applies
// ("default (20)" for the agent, "default (5)" for the router, and no choice above
// it), and who answers (the scripted stand-in for a model, or a real one).

/** Label the step-limit choices for the selected mode; a choice above it is disabled. */
export function renderStepLimit(form, config) {
  const limit = config.default_max_steps?.[form.elements.mode.value] ?? null;
  const select = form.elements.max_steps;
  for (const option of select.options) {
    if (!option.value) {
      option.textContent = limit === null ? "default" : `default (${limit})`;
      continue;
    }
    option.disabled = limit !== null && Number(option.value) > limit;
  }
  if (select.selectedOptions[0]?.disabled) select.value = "";
}

/** What answers the questions here. */
export function driverNote(config) {
  if (config.driver === "openai") {
    return "A real model answers here (AGENT_DEMO_DRIVER=openai: agent_core/drivers/openai.py).";
  }
  return "The agent here is a scripted stand-in for a model: weather questions call get_weather "
    + "(then calculator), arithmetic such as “What is 6 * 7?” calls calculator, anything else "
    + "gets a plain answer. agent_core/drivers/openai.py talks to a real model "
    + "(AGENT_DEMO_DRIVER=openai).";
}
