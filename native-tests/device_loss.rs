//! The wgpu device lost mid-use (destroyed, as a driver reset or a removed GPU would lose it):
//! every later op is `Error::DeviceLost`, never a panic. A test binary of its own, because
//! the wgpu backend is shared by the whole process and stays lost.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use webtensor::{ops, Error, Tensor};

#[test]
fn a_lost_device_gives_device_lost_errors_not_panics() {
    let Some(device) = common::wgpu() else { return };
    let a = Tensor::from_vec(&device, vec![1.0f32, 2.0, 3.0], [3]).unwrap();
    let b = ops::add(&a, &a).unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
    // Recorded but not yet run when the device goes.
    let pending = ops::add(&b, &a).unwrap();

    device.lose_for_testing();

    type Step<'a> = (&'a str, Box<dyn Fn() -> Result<(), Error> + 'a>);
    let steps: Vec<Step> = vec![
        (
            "pending download",
            Box::new(|| pending.to_vec::<f32>().map(drop)),
        ),
        ("download", Box::new(|| b.to_vec::<f32>().map(drop))),
        (
            "op",
            Box::new(|| ops::add(&a, &b)?.to_vec::<f32>().map(drop)),
        ),
        (
            "upload",
            Box::new(|| {
                Tensor::from_vec(&device, vec![0f32; 1024], [1024])?
                    .to_vec::<f32>()
                    .map(drop)
            }),
        ),
        ("synchronize", Box::new(|| device.synchronize())),
    ];
    for (what, step) in &steps {
        let outcome = catch_unwind(AssertUnwindSafe(step))
            .unwrap_or_else(|_| panic!("{what} after the device was lost panics"));
        match outcome {
            Err(e @ Error::DeviceLost { .. }) => eprintln!("{what}: {e}"),
            Err(e) => panic!("{what}: expected DeviceLost, got: {e}"),
            Ok(()) => panic!("{what} succeeded on a lost device"),
        }
    }
}
