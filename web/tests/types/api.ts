// A TypeScript program over the package's API as its .d.ts declares it, checked by
// `tsc --noEmit` in types.test.mjs (never run). Each `@ts-expect-error` marks a use the
// declarations must refuse: if the .d.ts loosens or drifts (a field renamed, a parameter
// type lost), tsc reports the directive as unused and the test fails.
import init, {
  createDevice,
  Model,
  opSilu,
  runBenchmarks,
  peerRatios,
  version,
  cachedModels,
  deleteCachedModel,
  estimateModel,
  type CachedModel,
  type MemoryEstimate,
  type ModelTooLargeError,
  type BenchReport,
  type ChatMessage,
  type DeviceInfo,
  type GenerateOptions,
  type GenerationStats,
  type PeerRatio,
  type TokenCallback,
} from "webtensor";

export async function useTheApi(): Promise<string> {
  await init();
  const device = await createDevice("cpu");
  const tuned = await createDevice({ backend: "cpu", cpu: { simd: "scalar" }, wgpu: { rowTeams: "on", intDot: false } });
  const tunedOptions: [string, string][] | undefined = tuned.info().info.options;
  // @ts-expect-error: an unknown device option
  await createDevice({ wgpu: { rowTeam: "on" } });
  const info: DeviceInfo = device.info();
  const adapter: string = info.info.device_name;
  const simd: string | undefined | null = info.info.simd;
  const x = device.tensor(new Float32Array([1, 2, 3]), [1, 3]);
  const y: Float32Array | Uint32Array | Int32Array | Uint8Array = await opSilu(x).toArray();

  const model = await Model.builtin(device, (phase: string, done: number, total: number) => void [phase, done, total]);
  const options: GenerateOptions = { maxTokens: 8, temperature: 0.7, topK: 40, topP: 0.9, seed: 1 };
  const onToken: TokenCallback = (piece, generated, tokensPerSec) => void [piece.length, generated, tokensPerSec];
  const stats: GenerationStats = await model.generate("And God said", options, onToken);
  const n: number = stats.generatedTokens + stats.promptTokens;
  const formats: string = model.activationPath;
  const eos: boolean = stats.stoppedAtEos || stats.stopped;
  // @ts-expect-error: the options are camelCase, as the code reads them
  await model.generate("x", { max_tokens: 8 });
  // @ts-expect-error: the statistics are camelCase too
  void stats.generated_tokens;

  const messages: ChatMessage[] = [{ role: "user", content: "Hello" }];
  const reply: GenerationStats = await model.chat(messages, { maxTokens: 4 }, onToken);
  // @ts-expect-error: a message needs its content
  await model.chat([{ role: "user" }]);

  const report: BenchReport = await runBenchmarks({ backends: ["cpu"], ops: ["add"], runs: 1, minSampleSecs: 0.01 });
  const device0: string = report.rows[0].device;
  const median: number | undefined | null = report.rows[0].median_us;
  const ratios: PeerRatio[] = peerRatios(report);
  const speedup: number = ratios.length ? ratios[0].speedup : 1;
  // @ts-expect-error: an unknown benchmark option
  await runBenchmarks({ repeats: 3 });

  const cached: CachedModel[] = await cachedModels();
  const removed: boolean = await deleteCachedModel(cached[0].url);
  const estimate: MemoryEstimate = await estimateModel(device, "/model.gguf");
  const fits: boolean = estimate.fits && estimate.deviceBytes < estimate.fileBytes * 2;
  const refused = (e: unknown): number | undefined =>
    e instanceof Error && e.name === "ModelTooLargeError" ? (e as ModelTooLargeError).estimate.pageBytes : undefined;
  // @ts-expect-error: sizes are camelCase
  void estimate.file_bytes;

  return `${removed} ${fits} ${refused} ${version()} ${adapter} ${simd} ${y.length} ${n} ${eos} ${reply.text} ${formats} ${device0} ${median} ${speedup} ${tunedOptions?.length}`;
}
