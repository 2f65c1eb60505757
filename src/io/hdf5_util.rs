//! Small helpers over hdf5-metno for the attribute and dataset shapes our files use.

use hdf5::types::VarLenUnicode;
use hdf5::{H5Type, Location};
use ndarray::Array2;
use std::str::FromStr;

/// Writes a scalar attribute.
pub fn write_scalar<T: H5Type>(loc: &Location, name: &str, value: T) -> hdf5::Result<()> {
    loc.new_attr::<T>().create(name)?.write_scalar(&value)
}

/// Writes a 1-D array attribute.
pub fn write_array<T: H5Type>(loc: &Location, name: &str, values: &[T]) -> hdf5::Result<()> {
    loc.new_attr::<T>()
        .shape(values.len())
        .create(name)?
        .write_raw(values)
}

/// Writes a variable-length UTF-8 string attribute (NUL characters are dropped: HDF5
/// strings cannot hold them).
pub fn write_string(loc: &Location, name: &str, value: &str) -> hdf5::Result<()> {
    let clean: String = value.chars().filter(|&c| c != '\0').collect();
    let s = VarLenUnicode::from_str(&clean).map_err(|e| hdf5::Error::from(e.to_string()))?;
    loc.new_attr::<VarLenUnicode>()
        .create(name)?
        .write_scalar(&s)
}

/// Reads a string attribute stored either as variable-length or fixed-length text.
pub fn read_string(loc: &Location, name: &str) -> hdf5::Result<String> {
    let attr = loc.attr(name)?;
    if let Ok(s) = attr.read_scalar::<VarLenUnicode>() {
        return Ok(s.as_str().to_string());
    }
    let s = attr.read_scalar::<hdf5::types::VarLenAscii>()?;
    Ok(s.as_str().to_string())
}

/// Reads a numeric scalar attribute as f64 (any integer or float type on disk).
pub fn read_f64(loc: &Location, name: &str) -> hdf5::Result<f64> {
    loc.attr(name)?.read_scalar::<f64>()
}

/// Reads a numeric array attribute as i64 values (a negative count stays negative).
pub fn read_i64_array(loc: &Location, name: &str) -> hdf5::Result<Vec<i64>> {
    loc.attr(name)?.read_raw::<i64>()
}

/// Reads a numeric array attribute as f64 values.
pub fn read_f64_array(loc: &Location, name: &str) -> hdf5::Result<Vec<f64>> {
    loc.attr(name)?.read_raw::<f64>()
}

/// Packs 3-vectors into an (n, 3) array converted by `f`.
pub fn vectors_to_array<T: Copy>(v: &[[f64; 3]], f: impl Fn(f64) -> T) -> Array2<T> {
    Array2::from_shape_fn((v.len(), 3), |(i, k)| f(v[i][k]))
}
