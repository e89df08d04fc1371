// A session's agents as a collapsible tree (docs/viewer.md, "Agents and subagents"): each agent's
// steps in order, and under the parent's step whose tool call spawned a subagent, that subagent (the
// store's `spawned_by`); a subagent whose spawning step could not be told is listed after its
// parent's steps, "spawned by" it. A filter shows one agent's steps alone. Ids and types are the
// harness's words: set as text, never markup.

import {h} from "./text.js";

// `view`: the session page (session.js): its list of steps, its links, the agent shown.
export function agentTree({agents, steps}, view) {
  if (!agents || agents.length < 2) return null; // the main agent alone: nothing to draw
  const place = new Map(steps.map((s, i) => [s.trace_id, i + 1]));
  const under = new Map(); // a step's trace id, or an agent's id where none can be told → the subagents under it
  for (const agent of agents) {
    if (agent.parent === null) continue;
    const key = agent.spawned_by && place.has(agent.spawned_by.trace_id) ? agent.spawned_by.trace_id : `agent:${agent.parent}`;
    under.set(key, [...(under.get(key) || []), agent]);
  }
  const main = agents.find((a) => a.parent === null);
  const filter = h("select", {"aria-label": "Show the steps of one agent", onchange: () => showAgent(view, filter.value || null)},
    h("option", {value: ""}, "all agents"), agents.map((a) => h("option", {value: a.id}, label(a))));

  function node(agent) {
    const own = steps.filter((s) => s.agent === agent.id);
    const spawned = agent.spawned_by && place.has(agent.spawned_by.trace_id)
      ? `spawned by step ${place.get(agent.spawned_by.trace_id)}` + (agent.spawned_by.tool_call_id ? ` (call ${agent.spawned_by.tool_call_id})` : "")
      : agent.parent !== null ? `spawned by ${agent.parent}` : "";
    const items = own.map((s) => h("li", {},
      h("a", {href: `/traces/${s.trace_id}`, onclick: (e) => view.follow(e, `/traces/${s.trace_id}`)}, `Step ${place.get(s.trace_id)}`),
      children(under.get(s.trace_id))));
    return h("li", {class: "agent", dataset: {agent: agent.id}},
      h("details", {open: true},
        h("summary", {}, h("code", {}, agent.id), agent.type && agent.type !== agent.id ? ` ${agent.type}` : "",
          agent.side ? " (side request)" : "", ` · ${agent.steps} step${agent.steps === 1 ? "" : "s"}`,
          spawned ? ` · ${spawned}` : ""),
        own.length < agent.steps ? h("p", {class: "note"}, "More of its steps load as you scroll.") : null,
        h("ol", {class: "agent-steps"}, items),
        children(under.get(`agent:${agent.id}`))));
  }

  function children(found) {
    return found && found.length ? h("ul", {class: "agent-tree"}, found.map(node)) : null;
  }

  return h("section", {class: "agents", "aria-label": "Agents of the session"},
    h("p", {class: "facts"}, `${agents.length} agents · `, h("label", {}, "show ", filter)),
    h("ul", {class: "agent-tree"}, node(main)));
}

function label(agent) {
  return agent.type && agent.type !== agent.id ? `${agent.id} (${agent.type})` : agent.id;
}

// Which steps are shown: those of `agent` alone, or all (null); steps drawn later follow it (session.js).
function showAgent(view, agent) {
  view.agent = agent;
  for (const el of view.list.querySelectorAll("[data-step]")) el.hidden = agent !== null && el.dataset.agent !== agent;
}
