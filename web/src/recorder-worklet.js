// The microphone tap, on the audio rendering thread: each 128-frame block of the first input
// channel goes to the page (audio.js), which collects them until Stop. An AudioWorklet replaces
// the deprecated ScriptProcessorNode, which ran on the page's main thread.
class TallowRecorder extends AudioWorkletProcessor {
  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (channel && channel.length) this.port.postMessage(channel.slice(0));
    return true; // keep running until the node is disconnected
  }
}

registerProcessor("tallow-recorder", TallowRecorder);
