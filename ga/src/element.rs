//! The element types a global array holds (f32, f64, i32, i64): a sealed trait, so that
//! the layer's byte arithmetic and its C codes cover every type there is.

use std::fmt::Debug;

mod sealed {
    pub trait Sealed {}
}

/// The element type of an array, as the C API names it (`GPULMT_GA_F32`...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ElemType {
    F32 = 0,
    F64 = 1,
    I32 = 2,
    I64 = 3,
}

impl ElemType {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            ElemType::F32 | ElemType::I32 => 4,
            ElemType::F64 | ElemType::I64 => 8,
        }
    }

    /// The type of a C code, if it names one.
    pub fn from_code(code: i32) -> Option<ElemType> {
        [ElemType::F32, ElemType::F64, ElemType::I32, ElemType::I64].into_iter().find(|t| *t as i32 == code)
    }

    /// Its Rust name.
    pub fn name(self) -> &'static str {
        match self {
            ElemType::F32 => "f32",
            ElemType::F64 => "f64",
            ElemType::I32 => "i32",
            ElemType::I64 => "i64",
        }
    }
}

impl std::fmt::Display for ElemType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A type a global array can hold. Sealed: f32, f64, i32 and i64 only.
pub trait Element: sealed::Sealed + Copy + Default + PartialEq + Debug + Send + Sync + 'static {
    /// Its [`ElemType`].
    const TYPE: ElemType;

    /// `self + scale * x`: one element of an accumulate (integers wrap, as C's
    /// unsigned arithmetic would; Global Arrays leaves overflow undefined).
    fn accumulate(self, scale: Self, x: Self) -> Self;
}

macro_rules! float_element {
    ($t:ty, $e:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const TYPE: ElemType = $e;
            fn accumulate(self, scale: Self, x: Self) -> Self {
                self + scale * x
            }
        }
    };
}

macro_rules! int_element {
    ($t:ty, $e:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const TYPE: ElemType = $e;
            fn accumulate(self, scale: Self, x: Self) -> Self {
                self.wrapping_add(scale.wrapping_mul(x))
            }
        }
    };
}

float_element!(f32, ElemType::F32);
float_element!(f64, ElemType::F64);
int_element!(i32, ElemType::I32);
int_element!(i64, ElemType::I64);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_sizes_and_accumulate() {
        for t in [ElemType::F32, ElemType::F64, ElemType::I32, ElemType::I64] {
            assert_eq!(ElemType::from_code(t as i32), Some(t));
        }
        assert_eq!(ElemType::from_code(4), None);
        assert_eq!((f32::TYPE.size(), f64::TYPE.size(), i32::TYPE.size(), i64::TYPE.size()), (4, 8, 4, 8));
        assert_eq!(2.0f64.accumulate(3.0, 4.0), 14.0);
        assert_eq!(i32::MAX.accumulate(1, 1), i32::MIN);
        assert_eq!(5i64.accumulate(-2, 3), -1);
    }
}
