// Models by URL and from the browser's cache: the list of cached models with their sizes,
// deleting one, and the memory estimate shown before a download.
import { cachedModels, deleteCachedModel, estimateModel } from "./pkg/webtensor.js";

const $ = (id) => document.getElementById(id);
const mb = (bytes) => `${(bytes / 1e6).toFixed(1)} MB`;

/// Fills the "cached" select with the cached models; resolves with how many there are.
export async function refreshCache() {
  const select = $("cached-models");
  const models = await cachedModels();
  select.replaceChildren();
  for (const m of models) {
    const option = document.createElement("option");
    option.value = m.url;
    option.textContent = `${m.url.split("/").pop()} (${mb(m.bytes)})`;
    select.appendChild(option);
  }
  if (!models.length) select.appendChild(new Option("(none yet)", ""));
  $("delete-cached").disabled = !models.length;
  return models.length;
}

/// Deletes the selected cached model and refreshes the list.
export async function deleteSelected() {
  const url = $("cached-models").value;
  if (url) await deleteCachedModel(url);
  await refreshCache();
}

/// Shows what the model at `url` will need before it is downloaded.
export async function showEstimate(device, url) {
  const note = $("model-estimate");
  const e = await estimateModel(device, url);
  note.textContent = `${mb(e.fileBytes)} download, ${mb(e.deviceBytes)} on ${device.backend}` +
    (e.fits ? "" : ` — too large here: ${e.reason}`);
  return e;
}
