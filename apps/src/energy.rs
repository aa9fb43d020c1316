//! GPU energy readings through NVML (`nvmlDeviceGetTotalEnergyConsumption`,
//! millijoules since the driver loaded), for the apps that report joules
//! beside time (`sssp`).
//!
//! NVML is loaded at run time by the `nvml-wrapper` crate (`dlopen` of
//! `libnvidia-ml.so.1`, then `libnvidia-ml.so`): a machine without the
//! driver (CI) builds and runs, and [`EnergyMeter::for_gpu`] says why there
//! is no reading; the apps then print `energy: n/a (no NVML)`. The counter
//! is the whole GPU's: PEs sharing a GPU (MPS) each see all of it
//! ([`EnergyMeter::share`]). The H100 we measured moves it in steps of
//! about 12-14 J, so readings around one short search are coarse: compare
//! sums over many searches.

use cpnet::GpuPe;
use cudarc::driver::sys::CUdevice_attribute as A;
use nvml_wrapper::Nvml;

/// The energy counter of one PE's GPU.
pub struct EnergyMeter {
    nvml: Nvml,
    /// The GPU's PCI address, as NVML looks it up (`domain:bus:device.0`, hex).
    bus_id: String,
    pes_on_device: u32,
}

impl EnergyMeter {
    /// The meter of `pe`'s GPU (found by its PCI address, so
    /// `CUDA_VISIBLE_DEVICES` does not matter); `Err` says why there is none.
    ///
    /// # Errors
    /// No NVML library, no such device, or a GPU without the counter.
    pub fn for_gpu(pe: &GpuPe) -> Result<EnergyMeter, String> {
        let attr = |a| pe.cuda().attribute(a).map_err(|e| format!("cuDeviceGetAttribute: {e}"));
        let bus_id = format!(
            "{:x}:{:x}:{:x}.0",
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
        );
        let nvml = Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init()
            .or_else(|_| Nvml::init())
            .map_err(|e| format!("NVML: {e}"))?;
        let m = EnergyMeter { nvml, bus_id, pes_on_device: pe.pes_on_device().max(1) };
        m.read_mj()?;
        Ok(m)
    }

    /// The GPU's energy counter in millijoules.
    ///
    /// # Errors
    /// NVML's, in words.
    pub fn read_mj(&self) -> Result<u64, String> {
        let d = self.nvml.device_by_pci_bus_id(self.bus_id.as_str()).map_err(|e| format!("NVML device {}: {e}", self.bus_id))?;
        d.total_energy_consumption().map_err(|e| format!("nvmlDeviceGetTotalEnergyConsumption ({}): {e}", self.bus_id))
    }

    /// This PE's share of a reading of its GPU: `1 / PEs on the GPU` (summed
    /// over the PEs, each GPU counts once).
    pub fn share(&self) -> f64 {
        1.0 / f64::from(self.pes_on_device)
    }
}
