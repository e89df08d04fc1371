// A rollout's own facts on its session page (agent RL, docs/rollouts.md): its group and reward, and
// once the trainer posted its logprobs, the training–inference gap: the k3 KL estimate, the share of
// tokens past the importance-ratio cap, the worst tokens (each a link to its step), and a switch that
// colours the heat map by each token's log-ratio instead of its probability.

import {get} from "./api.js";
import {h, percent} from "./text.js";

export async function rolloutFacts(key) {
  const path = `/v1/rollouts/${encodeURIComponent(key)}`;
  const [reward, gap] = await Promise.all([get(`${path}/reward`).catch(() => null), get(`${path}/gap`).catch(() => null)]);
  if (!reward && !gap) return null;
  const byTrace = new Map((gap?.steps || []).map((s) => [s.trace_id, s]));
  return {reward, gap, ratios: (traceId) => byTrace.get(traceId)?.log_ratios};
}

// The panel under the session's title; `onMode(mode)` redraws the heat maps ("p" or "gap").
export function rolloutPanel(facts, {onMode, onNavigate}) {
  const {reward, gap} = facts;
  const items = [];
  if (reward?.group) items.push(`group ${reward.group}`);
  if (reward) items.push(reward.reward !== null ? `reward ${reward.reward}` : "no reward posted yet");
  if (reward?.steps?.length) items.push(`${reward.steps.length} step reward${reward.steps.length === 1 ? "" : "s"}`);
  const panel = h("div", {class: "rollout"}, h("p", {class: "facts"}, h("span", {class: "label"}, "Rollout "), items.join(" · ")));
  if (!gap) return panel;
  panel.append(h("p", {class: "facts gap-facts"},
    h("span", {class: "label"}, "Training–inference gap "),
    `KL (k3) ${gap.kl_k3_overflow ? "past 1.8e308 (a float's range)" : gap.kl_k3 === null ? "–" : gap.kl_k3.toExponential(2)} · ${percent(gap.past_cap)} of ${gap.tokens} tokens past ` +
    `ratio ${gap.cap} · mean |log-ratio| ${gap.mean_abs_log_ratio?.toFixed(4) ?? "–"}`));
  const toggle = h("div", {class: "mode", role: "radiogroup", "aria-label": "Heat map"},
    ["p", "gap"].map((mode) => h("label", {}, h("input", {type: "radio", name: "heat", value: mode, checked: mode === "p",
      onchange: () => onMode(mode)}), mode === "p" ? " p(token)" : " gap: log π_trainer − log π_sampler")));
  const worst = h("ol", {class: "worst", "aria-label": "The tokens where the trainer and the sampler disagree most"},
    gap.worst.map((w) => h("li", {}, h("a", {href: `/traces/${w.trace_id}`, onclick: (e) => {
      if (e.button || e.metaKey || e.ctrlKey) return;
      e.preventDefault();
      onNavigate(`/traces/${w.trace_id}`);
    }}, `step ${w.step}, token ${w.index}`), " ", h("code", {}, w.text ?? "▪"), ` log-ratio ${w.log_ratio.toFixed(3)}`)));
  panel.append(toggle, h("details", {}, h("summary", {}, "worst tokens"), worst));
  return panel;
}
