// Provider rules for the `openai-realtime` export, in the browser (SPEC C4, case F18).
//
//   import { realtimeExport } from "/static/exportrules.js";
//   const { tools, dropped } = realtimeExport(client.catalog.tools);
//   // session.update {tools}; log each of `dropped` (name, rule, message)
//
// The same rule as catalog/compat.py `adapt(tool, "openai-realtime")`, so a page that
// builds `session.update` from the wire catalog sends what the server-side exporter
// would: OpenAI refuses the whole tools list when one schema has `oneOf`, `anyOf`,
// `allOf`, `enum` or `not` at its root. A root combinator whose branches only list
// `required` names is dropped (`allOf` merges into `required`) and stated in the
// description; any other one cannot be exported, and that tool is left out and reported
// instead of breaking every other tool. tests/catalog/test_catalog_exportrules_js.py
// checks that both sides agree on every case.

/** Root keywords OpenAI (Chat Completions and Realtime) refuses, in check order. */
export const OPENAI_ROOT = ["oneOf", "anyOf", "allOf", "enum", "not"];

const DESCRIBABLE = new Set(["required", "description", "title", "$comment"]);

const SENTENCES = {
  oneOf: (options) => `Arguments must include exactly one of: ${options}.`,
  anyOf: (options) => `Arguments must include at least one of: ${options}.`,
};

function isObject(value) {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** The `required` names of a branch that only lists names, else null. */
function branchNames(branch) {
  if (!isObject(branch) || !Object.keys(branch).every((key) => DESCRIBABLE.has(key))) return null;
  const names = branch.required ?? [];
  if (!Array.isArray(names) || !names.every((name) => typeof name === "string")) return null;
  return names;
}

function phrase(names) {
  return names.length ? names.map((name) => `\`${name}\``).join(" and ") : "nothing";
}

/**
 * One tool's parameters and description as OpenAI Realtime accepts them (SPEC C4).
 * @param {{name: string, description: string, parameters: object}} tool  a wire ToolInfo
 * @returns {{entry: object|null, findings: Array<{rule: string, message: string, adapted: boolean}>}}
 *   `entry` is the `session.update` tool, or null when the tool cannot be exported.
 */
export function adaptRealtime(tool) {
  const schema = structuredClone(tool.parameters);
  const sentences = [];
  const findings = [];
  for (const key of OPENAI_ROOT) {
    if (!(key in schema)) continue;
    const value = schema[key];
    const lists = (Array.isArray(value) ? value : [value]).map(branchNames);
    if (key === "enum" || lists.some((names) => names === null)) {
      findings.push({
        rule: "root-combinator",
        message: `${key} at the root of the parameters is refused, and it says more than which names are required`,
        adapted: false,
      });
      continue;
    }
    delete schema[key];
    if (key === "allOf") {
      const required = [...(schema.required ?? [])];
      for (const names of lists) for (const name of names) if (!required.includes(name)) required.push(name);
      schema.required = required;
    } else if (key === "not") {
      sentences.push(`Arguments must not include all of: ${phrase(lists[0])}.`);
    } else {
      sentences.push(SENTENCES[key](lists.map(phrase).join(" | ")));
    }
    findings.push({ rule: "root-combinator", message: `${key} at the root was adapted`, adapted: true });
  }
  if (findings.some((finding) => !finding.adapted)) return { entry: null, findings };
  const description = [tool.description.trim(), ...sentences].filter((part) => part).join(" ");
  return { entry: { type: "function", name: tool.name, description, parameters: schema }, findings };
}

/**
 * The `openai-realtime` export of wire ToolInfos, with the tools it had to leave out.
 * @param {Array<{name: string, description: string, parameters: object}>} tools
 * @returns {{tools: object[], dropped: Array<{name: string, rule: string, message: string}>}}
 */
export function realtimeExport(tools) {
  const out = [];
  const dropped = [];
  for (const tool of tools) {
    const { entry, findings } = adaptRealtime(tool);
    if (entry) out.push(entry);
    for (const finding of findings) {
      if (!finding.adapted) dropped.push({ name: tool.name, rule: finding.rule, message: finding.message });
    }
  }
  return { tools: out, dropped };
}
