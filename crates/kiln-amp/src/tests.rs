//! The scaler's rules (training under mixed precision is tested where the steps live:
//! kiln-train for one device, kiln-ddp for data parallelism).

use crate::{GradScaler, GradScalerConfig};

#[test]
fn scaler_halves_on_overflow_and_doubles_after_exactly_the_interval() {
    let mut scaler = GradScaler::new(GradScalerConfig {
        growth_interval: 3,
        ..GradScalerConfig::default()
    });
    assert!(!scaler.update(true), "a non-finite step is skipped");
    assert_eq!(scaler.scale(), 32768.0);
    assert!(scaler.update(false) && scaler.update(false));
    assert_eq!(scaler.scale(), 32768.0, "not before the interval");
    assert!(scaler.update(false));
    assert_eq!(scaler.scale(), 65536.0, "exactly after it");
    assert_eq!(scaler.growth_tracker(), 0);
    let saved = serde_json::to_string(&scaler).unwrap();
    assert_eq!(
        serde_json::from_str::<GradScaler>(&saved).unwrap(),
        scaler,
        "the scaler round-trips through a checkpoint"
    );
}
