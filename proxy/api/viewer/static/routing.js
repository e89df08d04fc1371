// A step's chip for the vLLM routing's receipt (docs/routing.md, "The receipt"), shown on the step
// (step.js).

import {count} from "./text.js";

const REASONS = {home: "its home", faster: "the least expected time to first token", least_loaded: "least loaded",
  retry: "another server failed first", only: "the only server"};

const secs = (s) => (s === undefined ? "?" : `${Number(s).toFixed(2)} s`);

// The vLLM routing's receipt: where the step went and why, how much of its prompt that server had cached against
// what routing predicted, and its time to first token against the expected one (hover: the price's terms, the
// runner-up's).
export function routeChip(route) {
  const cached = route.cached !== undefined ? `${count(route.cached)} cached` : "cached unknown";
  const guess = route.index === "estimate" ? "estimated" : "predicted";
  const lines = [`routed by ${route.policy}: ${REASONS[route.reason] || route.reason}`,
    `score ${route.score}, load ${route.load}; ${count(route.predicted)} cached tokens ${guess}`];
  let wait = "";
  if (route.expected_ttft !== undefined) {
    wait = ` · first token ${secs(route.ttft)} (${secs(route.expected_ttft)} expected)`;
    lines.push(`expected ${secs(route.expected_ttft)} = ${secs(route.overhead_seconds)} + (` +
      `${count(route.prefill_tokens)} to read + ${count(route.queued_tokens)} queued) ÷ ` +
      `${count(Math.round(route.prefill_rate))} tokens/s + ${secs(route.decode_seconds)} for ` +
      `${route.decoding} decoding` + (route.others_waiting ? `; ${route.others_waiting} others waiting` : "") +
      (route.spread_seconds ? `; the price may be off by ±${secs(route.spread_seconds)}` : "") +
      (route.met_queue_seconds !== undefined ? `; requests lately found ${secs(route.met_queue_seconds)} queued` : "") +
      (route.kept_conversations !== undefined ? `; keeps ${route.kept_conversations} conversations lately` : ""));
  }
  if (route.runner_up) lines.push(`runner-up ${route.runner_up}: score ${route.runner_up_score}, load ` +
    `${route.runner_up_load}, ${count(route.runner_up_predicted)} predicted` +
    (route.runner_up_expected_ttft !== undefined ? `, ${secs(route.runner_up_expected_ttft)} expected (` +
      `${count(route.runner_up_prefill_tokens)} to read + ${count(route.runner_up_queued_tokens)} queued` +
      (route.runner_up_spread_seconds ? `, ±${secs(route.runner_up_spread_seconds)}` : "") +
      (route.runner_up_met_queue_seconds !== undefined ? `, ${secs(route.runner_up_met_queue_seconds)} queued lately` : "") +
      (route.runner_up_kept_conversations !== undefined ? `, keeps ${route.runner_up_kept_conversations}` : "") +
      ")" : ""));
  return {text: `${route.server}: ${cached} (${count(route.predicted)} ${guess})${wait}`, title: lines.join("\n")};
}
