import { launch, startServer } from "../tests/harness.mjs";
const server = await startServer();
const browser = await launch({ webgpu: true });
const { page } = browser;
try {
  await page.goto(`${server.url}tests/blank.html`);
  const ops = (process.env.OPS || "qmatmul,matmul").split(",");
  const r = await page.evaluate(async (ops) => {
    const wt = await import("/pkg/webtensor.js");
    await wt.default();
    const report = await wt.runBenchmarks({ backends: ["wgpu"], ops, runs: 3 });
    return report;
  }, ops);
  console.log(JSON.stringify(r.ceilings ?? r.backends?.map(b=>b.ceilings)));
  for (const row of r.rows) console.log(row.op, row.case, row.shape, row.median_us|0, "us", row.checked);
} catch (e) { console.error(browser.logs.join("\n")); throw e; }
finally { await browser.close(); server.stop(); }
