//! Devices: where a tensor's memory lives.

use core::fmt;

/// A DLPack device type (`DLDeviceType`). Any `i32` is representable, so a code
/// from a newer producer is kept rather than being undefined behaviour.
#[repr(transparent)]
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceType(pub i32);

impl DeviceType {
    /// Host memory.
    pub const CPU: Self = Self(1);
    /// CUDA device memory.
    pub const CUDA: Self = Self(2);
    /// Pinned host memory from `cudaMallocHost`.
    pub const CUDA_HOST: Self = Self(3);
    /// OpenCL device memory.
    pub const OPENCL: Self = Self(4);
    /// Vulkan buffer.
    pub const VULKAN: Self = Self(7);
    /// Metal buffer (Apple).
    pub const METAL: Self = Self(8);
    /// Verilog simulator buffer.
    pub const VPI: Self = Self(9);
    /// ROCm device memory.
    pub const ROCM: Self = Self(10);
    /// Pinned host memory from `hipMallocHost`.
    pub const ROCM_HOST: Self = Self(11);
    /// Reserved for extension devices and tests.
    pub const EXT_DEV: Self = Self(12);
    /// CUDA unified memory from `cudaMallocManaged`.
    pub const CUDA_MANAGED: Self = Self(13);
    /// SYCL unified shared memory (oneAPI).
    pub const ONE_API: Self = Self(14);
    /// WebGPU buffer.
    pub const WEBGPU: Self = Self(15);
    /// Qualcomm Hexagon DSP.
    pub const HEXAGON: Self = Self(16);
    /// Microsoft MAIA.
    pub const MAIA: Self = Self(17);
    /// AWS Trainium (DLPack 1.2).
    pub const TRN: Self = Self(18);

    /// The short lower-case name (`"cpu"`, `"cuda"`, ...), or `None` for a code this
    /// crate does not know.
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            1 => "cpu",
            2 => "cuda",
            3 => "cuda_host",
            4 => "opencl",
            7 => "vulkan",
            8 => "metal",
            9 => "vpi",
            10 => "rocm",
            11 => "rocm_host",
            12 => "ext_dev",
            13 => "cuda_managed",
            14 => "oneapi",
            15 => "webgpu",
            16 => "hexagon",
            17 => "maia",
            18 => "trn",
            _ => return None,
        })
    }

    /// Parses a name given by [`DeviceType::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        (0..=18).map(Self).find(|t| t.name() == Some(name))
    }

    /// Whether work on this memory is ordered by streams, so that DLPack's
    /// `stream` argument means something: CUDA, CUDA managed and ROCm.
    pub const fn has_streams(self) -> bool {
        matches!(self, Self::CUDA | Self::CUDA_MANAGED | Self::ROCM)
    }

    /// Checks a DLPack `stream` value for this device type, by the array API's
    /// rules: CUDA takes 1 (legacy default), 2 (per-thread default) or a handle
    /// above 2, and 0 is refused as ambiguous; ROCm takes 0 (default) or a
    /// handle above 2; -1 means "do not synchronise" on both. A device without
    /// streams takes none.
    pub const fn accepts_stream(self, stream: i64) -> bool {
        match self {
            Self::CUDA | Self::CUDA_MANAGED => stream == -1 || stream >= 1,
            Self::ROCM => stream == -1 || stream == 0 || stream > 2,
            _ => false,
        }
    }

    /// The stream a consumer passes when its caller named none: the legacy
    /// default stream, as the spec's tip recommends (an explicit value, since
    /// producers differ on what `None` means). `None` for devices without streams.
    pub const fn default_stream(self) -> Option<i64> {
        match self {
            Self::CUDA | Self::CUDA_MANAGED => Some(1),
            Self::ROCM => Some(0),
            _ => None,
        }
    }

    /// Whether ordinary CPU loads and stores may touch this memory: host, pinned
    /// host (CUDA and ROCm) and CUDA managed memory.
    pub const fn is_cpu_accessible(self) -> bool {
        matches!(self, Self::CPU | Self::CUDA_HOST | Self::CUDA_MANAGED | Self::ROCM_HOST)
    }
}

impl fmt::Debug for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "DeviceType({})", self.0),
        }
    }
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A device: its type and its index among devices of that type (`DLDevice`).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    /// The kind of device.
    pub device_type: DeviceType,
    /// Index of the device; 0 for CPU, pinned and managed memory.
    pub device_id: i32,
}

impl Device {
    /// The host.
    pub const CPU: Device = Device { device_type: DeviceType::CPU, device_id: 0 };

    /// A device from its type and index.
    pub const fn new(device_type: DeviceType, device_id: i32) -> Self {
        Device { device_type, device_id }
    }

    /// CUDA device `id`.
    pub const fn cuda(id: i32) -> Self {
        Device::new(DeviceType::CUDA, id)
    }

    /// See [`DeviceType::is_cpu_accessible`].
    pub const fn is_cpu_accessible(self) -> bool {
        self.device_type.is_cpu_accessible()
    }
}

impl Default for Device {
    fn default() -> Self {
        Device::CPU
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.device_type, self.device_id)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_values_follow_the_array_api() {
        let cuda = DeviceType::CUDA;
        assert!(cuda.accepts_stream(1) && cuda.accepts_stream(2) && cuda.accepts_stream(7) && cuda.accepts_stream(-1));
        assert!(!cuda.accepts_stream(0) && !cuda.accepts_stream(-2));
        let rocm = DeviceType::ROCM;
        assert!(rocm.accepts_stream(0) && rocm.accepts_stream(3) && rocm.accepts_stream(-1));
        assert!(!rocm.accepts_stream(1) && !rocm.accepts_stream(2));
        assert!(!DeviceType::CPU.accepts_stream(1) && !DeviceType::CPU.accepts_stream(-1));
        assert_eq!((cuda.default_stream(), rocm.default_stream(), DeviceType::CPU.default_stream()), (Some(1), Some(0), None));
        assert_eq!(DeviceType::CUDA_MANAGED.default_stream(), Some(1));
    }

    #[test]
    fn cpu_reachable_devices() {
        for t in [DeviceType::CPU, DeviceType::CUDA_HOST, DeviceType::CUDA_MANAGED, DeviceType::ROCM_HOST] {
            assert!(t.is_cpu_accessible(), "{t}");
        }
        for t in [DeviceType::CUDA, DeviceType::ROCM, DeviceType::METAL, DeviceType(5), DeviceType(-7)] {
            assert!(!t.is_cpu_accessible(), "{t}");
        }
    }

    #[test]
    fn streams_belong_to_cuda_and_rocm_memory() {
        let with: Vec<DeviceType> = (0..=20).map(DeviceType).filter(|t| t.has_streams()).collect();
        assert_eq!(with, [DeviceType::CUDA, DeviceType::ROCM, DeviceType::CUDA_MANAGED]);
    }

    #[test]
    fn names_round_trip_and_unknown_codes_print() {
        for code in 0..=20 {
            let t = DeviceType(code);
            if let Some(name) = t.name() {
                assert_eq!(DeviceType::from_name(name), Some(t));
            }
        }
        assert_eq!(DeviceType(99).to_string(), "DeviceType(99)");
        assert_eq!(Device::cuda(1).to_string(), "cuda:1");
    }
}
