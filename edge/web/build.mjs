// Bundles the playground into dist/, which is committed and embedded by the
// Go package in this directory. Output names carry a content hash, so the
// edge can let browsers cache them for good; index.html names them.
// The build is deterministic: the same sources give the same bytes.

import { build } from "esbuild";
import { copyFile, mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { basename } from "node:path";

const here = new URL(".", import.meta.url).pathname;
const dist = `${here}dist`;

await rm(dist, { recursive: true, force: true });
await mkdir(dist, { recursive: true });

const res = await build({
  absWorkingDir: here,
  entryPoints: { app: "src/main.ts", style: "src/style.css" },
  entryNames: "[name]-[hash]",
  outdir: "dist",
  bundle: true,
  minify: true,
  format: "esm",
  target: ["es2022", "chrome100", "firefox100", "safari15"],
  legalComments: "none",
  charset: "utf8",
  metafile: true,
  logLevel: "warning",
});

const names = {};
for (const [out, meta] of Object.entries(res.metafile.outputs)) {
  if (meta.entryPoint === "src/main.ts") names["app.js"] = basename(out);
  if (meta.entryPoint === "src/style.css") names["app.css"] = basename(out);
}
let html = await readFile(`${here}index.html`, "utf8");
html = html.replace(/\{\{(app\.(?:js|css))\}\}/g, (_, k) => {
  if (!names[k]) throw new Error(`no output for ${k}`);
  return names[k];
});
await writeFile(`${dist}/index.html`, html);
await copyFile(`${here}favicon.svg`, `${dist}/favicon.svg`);

for (const [out, meta] of Object.entries(res.metafile.outputs)) {
  console.log(`${out.padEnd(28)} ${(meta.bytes / 1024).toFixed(1).padStart(6)} KiB`);
}
