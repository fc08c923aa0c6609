//! Tensors in JavaScript: a handle to device memory, read back asynchronously.

use wasm_bindgen::prelude::*;
use webtensor::DType;

use crate::error::js;

/// An n-dimensional array on a device. Ops only record work on a GPU; it runs when a result
/// is read with [`Tensor::to_array`].
#[wasm_bindgen]
#[derive(Clone)]
pub struct Tensor {
    pub(crate) inner: webtensor::Tensor,
}

#[wasm_bindgen]
impl Tensor {
    /// The dimensions.
    #[wasm_bindgen(getter)]
    pub fn shape(&self) -> Vec<usize> {
        self.inner.dims().to_vec()
    }

    /// The element type: `"f32"`, `"u32"`, `"i32"`, `"i8"`, `"f16"`, `"q8_0"`, ...
    #[wasm_bindgen(getter)]
    pub fn dtype(&self) -> String {
        self.inner.dtype().name().to_string()
    }

    /// The backend holding the data (after a fallback it may differ from the device's).
    #[wasm_bindgen(getter)]
    pub fn backend(&self) -> String {
        self.inner.backend_name().to_string()
    }

    /// The same data under another shape with the same number of elements.
    pub fn reshape(&self, shape: Vec<usize>) -> Result<Tensor, JsValue> {
        Ok(Tensor {
            inner: js(self.inner.reshape(shape))?,
        })
    }

    /// Runs the recorded work this tensor depends on and resolves with its elements: a
    /// `Float32Array` (f32), `Uint32Array` (u32), `Int32Array` (i32), or the raw bytes as a
    /// `Uint8Array` for packed dtypes (f16, i8, block formats).
    #[wasm_bindgen(js_name = toArray, unchecked_return_type = "Float32Array | Uint32Array | Int32Array | Uint8Array")]
    pub async fn to_array(&self) -> Result<JsValue, JsValue> {
        let t = &self.inner;
        Ok(match t.dtype() {
            DType::F32 => {
                js_sys::Float32Array::from(&js(t.to_vec_async::<f32>().await)?[..]).into()
            }
            DType::U32 => js_sys::Uint32Array::from(&js(t.to_vec_async::<u32>().await)?[..]).into(),
            DType::I32 => js_sys::Int32Array::from(&js(t.to_vec_async::<i32>().await)?[..]).into(),
            _ => js_sys::Uint8Array::from(&js(t.to_bytes_async().await)?[..]).into(),
        })
    }
}
