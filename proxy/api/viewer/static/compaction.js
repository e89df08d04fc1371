// Compaction (docs/clients.md#compaction): a step that wrote a summary in place of the conversation
// before it, and a step whose prompt holds such summaries.

import {count, h} from "./text.js";

const HOW = {trigger: "asked for by the client (a compaction_trigger item)",
  compact: "asked for at POST /v1/responses/compact", threshold: "made by the server: the prompt passed its threshold",
  client: "the client's own (it keeps the summary)"};

export function compactionBadges(step) {
  const badges = [];
  const made = step.compaction;
  if (made) {
    badges.push(h("span", {class: "badge compaction", title: `A compaction, ${HOW[made.how] || made.how}: the ` +
      `model's summary replaces the ${count(made.replaced_items)} input items before it` +
      (made.id ? ` (summary ${made.id}).` : ".")},
    "compaction"));
  }
  if (step.compactions_expanded) {
    badges.push(h("span", {class: "badge compaction expanded", title: `Its input held ${step.compactions_expanded} ` +
      "compaction item(s), each read as its summary."}, "from summary"));
  }
  return badges;
}
