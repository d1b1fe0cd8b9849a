// A transcription result (the worker's JSON: text, language, duration, segments with start/end)
// as a file: the formats `tallow transcribe` writes (core/models/whisper_transcribe.py).

// 65.4 -> "00:01:05,400" (SRT: hours always, comma) or "01:05.400" (VTT: hours when needed).
export function formatTimestamp(seconds, alwaysHours = false, marker = ".") {
  let ms = Math.round(seconds * 1000);
  const hours = Math.floor(ms / 3600000);
  ms -= hours * 3600000;
  const minutes = Math.floor(ms / 60000);
  ms -= minutes * 60000;
  const secs = Math.floor(ms / 1000);
  ms -= secs * 1000;
  const two = (n) => String(n).padStart(2, "0");
  const head = alwaysHours || hours ? `${two(hours)}:` : "";
  return `${head}${two(minutes)}:${two(secs)}${marker}${String(ms).padStart(3, "0")}`;
}

export function transcriptAs(result, format) {
  if (!result) throw new Error("there is no transcript yet: transcribe something first");
  const segments = result.segments.filter((s) => s.text.trim());
  switch (format) {
    case "txt":
      return segments.map((s) => `${s.text.trim()}\n`).join("");
    case "srt":
      return segments.map((s, i) => `${i + 1}\n${formatTimestamp(s.start, true, ",")} --> ` +
        `${formatTimestamp(s.end, true, ",")}\n${s.text.trim()}\n`).join("\n");
    case "vtt":
      return ["WEBVTT\n", ...segments.map((s) => `${formatTimestamp(s.start)} --> ${formatTimestamp(s.end)}\n${s.text.trim()}\n`)].join("\n");
    case "json":
      return JSON.stringify({ text: result.text, language: result.language, duration: result.duration,
                              segments: segments.map((s, id) => ({ id, start: s.start, end: s.end, text: s.text })) }, null, 2) + "\n";
    default:
      throw new Error(`unknown transcript format ${JSON.stringify(format)} (txt, srt, vtt or json)`);
  }
}
