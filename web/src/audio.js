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
export async function startRecording() {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1 } });
  const ctx = new AudioContext();
  const source = ctx.createMediaStreamSource(stream);
  // ScriptProcessor is deprecated but needs no separate worklet file; 4096 frames per callback.
  const tap = ctx.createScriptProcessor(4096, 1, 1);
  const chunks = [];
  tap.onaudioprocess = (ev) => chunks.push(new Float32Array(ev.inputBuffer.getChannelData(0)));
  source.connect(tap);
  tap.connect(ctx.destination);
  return {
    async stop() {
      tap.disconnect();
      source.disconnect();
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
