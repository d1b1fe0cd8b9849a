// Audio in the page: files and the microphone become what the worker wants.
//
// WAV files go to the worker as bytes: tallow decodes them in Python and
// names the problem when a WAV layout is unsupported. Other formats are
// decoded by the browser (decodeAudioData) and resampled to 16 kHz mono with
// an OfflineAudioContext, as is microphone audio.
export const SAMPLE_RATE = 16000;

export function isWav(bytes) {
  const b = new Uint8Array(bytes, 0, Math.min(12, bytes.byteLength));
  const tag = (i) => String.fromCharCode(b[i], b[i + 1], b[i + 2], b[i + 3]);
  return b.length >= 12 && tag(0) === "RIFF" && tag(8) === "WAVE";
}

// Any AudioBuffer -> mono Float32Array at 16 kHz.
export async function toMono16k(audioBuffer) {
  const frames = Math.ceil(audioBuffer.duration * SAMPLE_RATE);
  const ctx = new OfflineAudioContext(1, Math.max(frames, 1), SAMPLE_RATE);
  const src = ctx.createBufferSource();
  src.buffer = audioBuffer; // mixed down to the context's one channel
  src.connect(ctx.destination);
  src.start();
  return (await ctx.startRendering()).getChannelData(0);
}

// {audio, samples}: the request fields for a file's bytes, or an Error saying why it cannot be read.
export async function prepareFile(name, bytes) {
  if (isWav(bytes)) return { audio: new Uint8Array(bytes), samples: false };
  const ctx = new OfflineAudioContext(1, 1, SAMPLE_RATE);
  let decoded;
  try {
    decoded = await ctx.decodeAudioData(bytes.slice(0));
  } catch (err) {
    throw new Error(`${name} is not an audio file this browser can decode (${err.message || err})`);
  }
  return { audio: await toMono16k(decoded), samples: true };
}

// Records from the microphone until stop() is called; stop() resolves to 16 kHz samples.
// The samples come from an AudioWorklet (recorder-worklet.js) on the audio thread.
export async function startRecording() {
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    throw new Error("this browser gives no microphone access here (it needs https or localhost)");
  }
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
  } catch (err) {
    throw new Error(`no microphone: ${err.message || err} (allow microphone access for this page, then try again)`);
  }
  const ctx = new AudioContext();
  await ctx.resume(); // started from a click it runs already; this covers a context created suspended
  await ctx.audioWorklet.addModule(new URL("recorder-worklet.js", import.meta.url));
  const source = ctx.createMediaStreamSource(stream);
  // No outputs: the node is a sink, rendered while its input is connected.
  const tap = new AudioWorkletNode(ctx, "tallow-recorder", { numberOfInputs: 1, numberOfOutputs: 0, channelCount: 1 });
  const chunks = [];
  tap.port.onmessage = (ev) => chunks.push(ev.data);
  source.connect(tap);
  return {
    async stop() {
      source.disconnect();
      tap.port.onmessage = null;
      stream.getTracks().forEach((t) => t.stop());
      const n = chunks.reduce((s, c) => s + c.length, 0);
      const buffer = new AudioBuffer({ length: Math.max(n, 1), sampleRate: ctx.sampleRate, numberOfChannels: 1 });
      let at = 0;
      for (const c of chunks) {
        buffer.copyToChannel(c, 0, at);
        at += c.length;
      }
      await ctx.close();
      return toMono16k(buffer);
    },
  };
}
