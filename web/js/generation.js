// A running generation as JavaScript expects it: `await` it for the statistics, or iterate it
// with `for await (const piece of generation)` for the pieces of text as they come. Leaving the
// loop early (break, return, throw) stops the generation. Made by Model.generate/chat (Rust,
// web/src/generation.rs) and by the worker model (web/js/worker.js).
export class Generation {
  constructor(onToken) {
    this._onToken = onToken ?? null;
    this._pieces = [];
    this._wake = null;
    this._done = false;
    this._failed = false;
    this._error = undefined;
    this._stop = null;
    this._result = null;
  }

  /// A piece of text (the callback form gets every token's, even an empty one).
  push(piece, generated, tokensPerSec) {
    if (this._onToken) {
      try {
        this._onToken(piece, generated, tokensPerSec);
      } catch (e) {
        console.error("onToken threw:", e);
      }
    }
    if (piece) {
      this._pieces.push(piece);
      this._wakeUp();
    }
  }

  /// The promise of the statistics, and how to stop the generation early.
  settle(result, stop) {
    this._stop = stop;
    this._result = result.then(
      (stats) => {
        this._done = true;
        this._wakeUp();
        return stats;
      },
      (e) => {
        this._done = true;
        this._failed = true;
        this._error = e;
        this._wakeUp();
        throw e;
      },
    );
    // Iterating without awaiting is fine: the iterator rethrows the error.
    this._result.catch(() => {});
  }

  _wakeUp() {
    const wake = this._wake;
    this._wake = null;
    wake?.();
  }

  then(onFulfilled, onRejected) {
    return this._result.then(onFulfilled, onRejected);
  }

  catch(onRejected) {
    return this._result.catch(onRejected);
  }

  finally(onFinally) {
    return this._result.finally(onFinally);
  }

  /// Asks the generation to end after its current step (as Model.stop() does).
  stop() {
    this._stop?.();
  }

  async *[Symbol.asyncIterator]() {
    try {
      for (;;) {
        if (this._pieces.length) {
          yield this._pieces.shift();
          continue;
        }
        if (this._done) {
          if (this._failed) throw this._error;
          return;
        }
        await new Promise((resolve) => {
          this._wake = resolve;
        });
      }
    } finally {
      if (!this._done) this.stop();
    }
  }
}

/// The reason `signal` was aborted with, or undefined when it was not.
export function abortReason(signal) {
  if (signal == null) return undefined;
  if (typeof signal.aborted !== "boolean") throw new TypeError("signal must be an AbortSignal");
  return signal.aborted ? (signal.reason ?? new DOMException("aborted", "AbortError")) : undefined;
}
