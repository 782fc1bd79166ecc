#include "hostd-a.h"
