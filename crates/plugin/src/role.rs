//! What each plexus binary is, written into the binary itself: an ELF note (name `plexus`, type
//! [`NOTE_TYPE`], the role as its descriptor) that every plexus binary's `main.rs` declares with
//! [`crate::binary_role!`], and the delegation seam reads from a file before it runs it
//! ([`crate::delegate`]).
//!
//! Why a note, not a name or an environment variable: a NAD's `type` names any file of the
//! admin's plugin directories, and the admin may have installed the meta-plugin under any name
//! (`multus`, a copy, a link); an environment variable reaches only the processes that inherit
//! it (a delegate run in-process by plexus-daemon inherits none). The note travels with the file:
//! whatever name it has and whoever delegates to it, a plexus binary that is not a delegate is
//! never run as one. It is read from the file's program headers (its `PT_NOTE` segments, a few
//! hundred bytes at the start of the file and the notes themselves): nothing is executed.

use std::path::Path;

/// The note's name (as ELF notes are named by their owner).
pub const NOTE_NAME: &[u8] = b"plexus";
/// The note's type: the binary's role.
pub const NOTE_TYPE: u32 = 1;
/// The section the note is linked into (`.note.*`: the linkers keep it and put it in a `PT_NOTE`
/// segment; a stripped binary keeps it, as it keeps `.note.gnu.build-id`).
pub const NOTE_SECTION: &str = ".note.plexus";

/// What a plexus binary is to a delegation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A CNI plugin that takes a network's config: plexus-macvlan, plexus-host-device, plexus-ipam.
    Delegate,
    /// The meta-plugin (`plexus`): its config is the admin's; run as a delegate it would take a
    /// tenant's `binDir`, `cniDir`, `kubeconfig`, `delegates`.
    Meta,
    /// plexus's binaries that are not CNI plugins: plexus-daemon, plexusctl.
    Tool,
}

impl Role {
    const fn word(self) -> &'static [u8] {
        match self {
            Role::Delegate => b"delegate",
            Role::Meta => b"meta",
            Role::Tool => b"tool",
        }
    }

    fn from_word(w: &[u8]) -> Option<Role> {
        [Role::Delegate, Role::Meta, Role::Tool].into_iter().find(|r| r.word() == w)
    }
}

/// Length of the descriptor: the role's word, NUL-padded.
const DESC_LEN: usize = 16;

/// One ELF note as the linker takes it: `namesz`, `descsz`, `type`, the name (NUL-terminated,
/// padded to 4) and the descriptor (padded to 4), in the target's byte order.
#[repr(C, align(4))]
pub struct Note {
    namesz: u32,
    descsz: u32,
    kind: u32,
    name: [u8; 8],
    desc: [u8; DESC_LEN],
}

impl Note {
    /// The note of a binary of `role`.
    pub const fn new(role: Role) -> Note {
        let mut name = [0u8; 8];
        let mut i = 0;
        while i < NOTE_NAME.len() {
            name[i] = NOTE_NAME[i];
            i += 1;
        }
        let word = role.word();
        let mut desc = [0u8; DESC_LEN];
        let mut i = 0;
        while i < word.len() {
            desc[i] = word[i];
            i += 1;
        }
        Note { namesz: NOTE_NAME.len() as u32 + 1, descsz: DESC_LEN as u32, kind: NOTE_TYPE, name, desc }
    }
}

/// Declares the role of this binary: one line in each plexus binary's `main.rs`, e.g.
/// `plexus_plugin::binary_role!(Delegate);`. A library must not use it (a binary linking two
/// libraries would carry two roles; [`of_file`] takes a binary with two for what it is not).
#[macro_export]
macro_rules! binary_role {
    ($role:ident) => {
        #[used]
        #[unsafe(link_section = ".note.plexus")]
        static PLEXUS_BINARY_ROLE: $crate::role::Note = $crate::role::Note::new($crate::role::Role::$role);
    };
}

/// What a file says it is: the role of its plexus note; `None` for a file that is not an ELF
/// binary, has no plexus note or cannot be read (a script, another project's plugin, a plexus
/// binary older than the notes). A file with several plexus notes is the least runnable of them.
pub fn of_file(path: &Path) -> Option<Role> {
    use object::read::ReadCache;
    use object::read::elf::{FileHeader, ProgramHeader};
    let file = std::fs::File::open(path).ok()?;
    let data = ReadCache::new(file);
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&data).ok()?;
    let endian = header.endian().ok()?;
    let mut found = None;
    for segment in header.program_headers(endian, &data).ok()? {
        let Ok(Some(mut notes)) = segment.notes(endian, &data) else { continue };
        while let Ok(Some(note)) = notes.next() {
            if note.name() != NOTE_NAME || note.n_type(endian) != NOTE_TYPE {
                continue;
            }
            let word = note.desc().split(|b| *b == 0).next().unwrap_or_default();
            // A word this build does not know is a role it would not run.
            let role = Role::from_word(word).unwrap_or(Role::Tool);
            if found.is_none_or(|r| r == Role::Delegate) {
                found = Some(role);
            }
        }
    }
    found
}

/// The smallest ELF file that carries `role`'s note (an ELF header, one `PT_NOTE` program header,
/// the note): what a plexus binary of that role looks like to [`of_file`], for tests. It is
/// not a program: run, it fails (the kernel finds nothing to load).
#[doc(hidden)]
pub fn elf_with_note(role: Role) -> Vec<u8> {
    const EHDR: usize = 64;
    const PHDR: usize = 56;
    let note = Note::new(role);
    let mut note_bytes = Vec::new();
    for w in [note.namesz, note.descsz, note.kind] {
        note_bytes.extend(w.to_ne_bytes());
    }
    note_bytes.extend(note.name);
    note_bytes.extend(note.desc);
    let mut f = vec![0x7f, b'E', b'L', b'F', 2, if cfg!(target_endian = "little") { 1 } else { 2 }, 1];
    f.resize(16, 0);
    f.extend(2u16.to_ne_bytes()); // e_type: EXEC
    f.extend(0u16.to_ne_bytes()); // e_machine: none
    f.extend(1u32.to_ne_bytes()); // e_version
    f.extend(0u64.to_ne_bytes()); // e_entry
    f.extend((EHDR as u64).to_ne_bytes()); // e_phoff
    f.extend(0u64.to_ne_bytes()); // e_shoff
    f.extend(0u32.to_ne_bytes()); // e_flags
    for h in [EHDR as u16, PHDR as u16, 1, 64, 0, 0] {
        f.extend(h.to_ne_bytes()); // e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum, e_shstrndx
    }
    f.extend(4u32.to_ne_bytes()); // p_type: PT_NOTE
    f.extend(4u32.to_ne_bytes()); // p_flags: R
    for v in [(EHDR + PHDR) as u64, 0, 0, note_bytes.len() as u64, note_bytes.len() as u64, 4] {
        f.extend(v.to_ne_bytes()); // p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align
    }
    f.extend(note_bytes);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_says_its_role_in_its_note() {
        let dir = tempfile::tempdir().unwrap();
        for role in [Role::Delegate, Role::Meta, Role::Tool] {
            let f = dir.path().join("binary");
            std::fs::write(&f, elf_with_note(role)).unwrap();
            assert_eq!(of_file(&f), Some(role));
        }
    }

    #[test]
    fn a_file_that_is_not_an_elf_binary_has_no_role() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("plugin");
        std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
        assert_eq!(of_file(&script), None);
        assert_eq!(of_file(&dir.path().join("missing")), None);
        assert_eq!(of_file(dir.path()), None, "a directory");
    }

    #[test]
    fn a_binary_without_the_note_has_no_role() {
        // This test binary declares no role (no binary_role! in a test harness).
        assert_eq!(of_file(Path::new("/proc/self/exe")), None);
        assert_eq!(of_file(Path::new("/bin/sh")), None);
    }

    #[test]
    fn the_note_is_laid_out_as_elf_notes_are() {
        let note = Note::new(Role::Meta);
        assert_eq!(std::mem::size_of::<Note>(), 12 + 8 + DESC_LEN);
        assert_eq!((note.namesz, note.descsz, note.kind), (7, 16, NOTE_TYPE));
        assert_eq!(&note.name, b"plexus\0\0");
        assert_eq!(&note.desc[..5], b"meta\0");
    }
}
