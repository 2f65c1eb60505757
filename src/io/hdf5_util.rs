//! Small helpers over hdf5-metno for the attribute and dataset shapes our files use.

use hdf5::types::{FixedUnicode, TypeDescriptor, VarLenUnicode};
use hdf5::{Group, H5Type, Location};
use ndarray::{Array, Array2, Dimension};
use std::str::FromStr;

/// Size of the chunks a dataset is stored in, each with its own checksum (KiB).
const CHUNK_KIB: usize = 1024;

/// Creates a file whose metadata carries checksums: the HDF5 1.10 object formats (version 3
/// superblock, version 2 object headers, chunk indexes with checksums), which h5py, yt,
/// pynbody and any HDF5 since 1.10 (2016) read. The 1.8 formats would index chunks with
/// version 1 B-trees, which have no checksum: a damaged index reads as zeros.
pub fn create_checksummed(path: &std::path::Path) -> hdf5::Result<hdf5::File> {
    hdf5::File::with_options()
        .with_fapl(|p| {
            p.libver_bounds(
                hdf5::file::LibraryVersion::V110,
                hdf5::file::LibraryVersion::V110,
            )
        })
        // No modification times in the object headers: the same data gives the same bytes.
        .with_fcpl(|p| p.obj_track_times(false))
        .create(path)
}

/// Creates a group without modification times (the same data gives the same bytes).
pub fn create_group(parent: &Group, name: &str) -> hdf5::Result<Group> {
    parent
        .create_group_builder()
        .obj_track_times(false)
        .create(name)
}

/// Writes a dataset in chunks of ~1 MiB, each with HDF5's Fletcher32 checksum, so damage to
/// the stored values fails the read instead of giving other numbers.
pub fn write_dataset<T: H5Type, D: Dimension>(
    group: &Group,
    name: &str,
    data: &Array<T, D>,
) -> hdf5::Result<()> {
    group
        .new_dataset_builder()
        .chunk_min_kb(CHUNK_KIB)
        .fletcher32()
        .with_data(data)
        .create(name)?;
    Ok(())
}

/// What failed when an HDF5 error is a failed checksum (damage to the file after it was
/// written); `None` for any other error.
pub fn damage(e: &hdf5::Error) -> Option<&'static str> {
    let text = e.to_string().to_lowercase();
    if text.contains("fletcher32") {
        Some("its values fail their Fletcher32 checksum")
    } else if text.contains("checksum") {
        Some("its metadata fail their checksum")
    } else {
        None
    }
}

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

/// Writes a fixed-length UTF-8 string attribute of the text's length, as GADGET-4 does.
/// Fixed-length strings live in the (checksummed) object header; variable-length ones would
/// live in HDF5's global heap, which has no checksum, and a damaged global heap makes HDF5
/// 1.10 loop forever. NUL characters are dropped (HDF5 strings cannot hold them); text over
/// 64 KiB is refused.
pub fn write_string(loc: &Location, name: &str, value: &str) -> hdf5::Result<()> {
    let clean: String = value.chars().filter(|&c| c != '\0').collect();
    let attr = loc
        .new_attr_builder()
        .empty_as(TypeDescriptor::FixedUnicode(clean.len().max(1)))
        .create(name)?;
    // HDF5 converts between fixed string sizes: the value goes through a buffer of the
    // smallest size class that holds it.
    match clean.len() {
        0..=64 => write_fixed::<64>(&attr, &clean),
        65..=1024 => write_fixed::<1024>(&attr, &clean),
        1025..=16384 => write_fixed::<16384>(&attr, &clean),
        16385..=65536 => write_fixed::<65536>(&attr, &clean),
        n => Err(hdf5::Error::from(format!(
            "attribute {name}: {n} bytes of text, more than the 65536 a string attribute holds here"
        ))),
    }
}

fn write_fixed<const N: usize>(attr: &hdf5::Attribute, text: &str) -> hdf5::Result<()> {
    let value = FixedUnicode::<N>::from_str(text).map_err(|e| hdf5::Error::from(e.to_string()))?;
    attr.as_writer().write_scalar(&value)
}

fn read_fixed<const N: usize>(attr: &hdf5::Attribute) -> hdf5::Result<String> {
    let value = attr.as_reader().read_scalar::<FixedUnicode<N>>()?;
    Ok(value.as_str().trim_end_matches('\0').to_string())
}

/// Reads a string attribute stored either as variable-length or fixed-length text.
pub fn read_string(loc: &Location, name: &str) -> hdf5::Result<String> {
    let attr = loc.attr(name)?;
    let fixed = match attr.dtype()?.to_descriptor()? {
        TypeDescriptor::FixedAscii(n) | TypeDescriptor::FixedUnicode(n) => Some(n),
        _ => None,
    };
    match fixed {
        Some(0..=64) => read_fixed::<64>(&attr),
        Some(65..=1024) => read_fixed::<1024>(&attr),
        Some(1025..=16384) => read_fixed::<16384>(&attr),
        Some(16385..=65536) => read_fixed::<65536>(&attr),
        Some(n) => Err(hdf5::Error::from(format!(
            "attribute {name}: a {n}-byte string, longer than this reader takes"
        ))),
        None => match attr.read_scalar::<VarLenUnicode>() {
            Ok(s) => Ok(s.as_str().to_string()),
            Err(_) => Ok(attr
                .read_scalar::<hdf5::types::VarLenAscii>()?
                .as_str()
                .to_string()),
        },
    }
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
